"""Decode without PyTorch's per-operation overhead: the same model, run by C calls.

A decode step of SmolLM2-135M is about 450 small PyTorch operations. Each costs microseconds of
dispatch, so on a fast CPU the step is bound by overhead, not by reading the weights (chapter 2's
third regime). `accelerate(model)` wraps a readable `Transformer` (fp32, int8 or int4 linears)
so that a one-token step, for one sequence or a batch that shares one KVCache, runs as about
eight calls into memwall's C library per layer, on buffers allocated once per batch size: fused
residual-add and RMSNorm, the matmul on the path `paths.choose` picked for that many rows, rotary
embedding and the cache write in one call, attention of one query per sequence, SiLU times up.
Everything else (prefill, paged caches, bf16) goes to the readable model, which stays the
reference: tests check that both give the same tokens and logits.
"""

from __future__ import annotations

import torch
from torch import nn

from memwall.engine import cpu_kernels
from memwall.engine.cpu import paths as kernel_paths
from memwall.engine.kv_cache import KVCache
from memwall.engine.linear import Linear
from memwall.engine.quant import Int4Linear, Int8Linear

MAX_ROWS = 64  # sequences per step; the matmul path for each row count is chosen by measurement


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class _Matmul:
    """y = layer(x) for fp32 rows, bound once to buffers: a C call, or the layer's own path."""

    def __init__(self, layer, x: torch.Tensor, y: torch.Tensor, lib, threads: int):
        path = kernel_paths.choose(layer, x)
        self.layer, self.path, self.x, self.y = layer, path, x, y
        rows, out, size = x.shape[0], layer.out_features, layer.in_features
        xp, yp = _ptr(x), _ptr(y)
        many = "_many" if path == "c_many" else ""
        self.call = None
        if path == "c" and isinstance(layer, Linear):
            self.call, self.args = (
                lib.fp32_linear,
                (xp, _ptr(layer.weight), yp, rows, size, out, threads),
            )
        elif path in ("c", "c_many") and isinstance(layer, Int8Linear):
            self.call = getattr(lib, "int8_linear" + many)
            self.args = (xp, _ptr(layer.codes), _ptr(layer.scales), yp, rows, size, out, threads)
        elif path in ("c", "c_many") and isinstance(layer, Int4Linear):
            common = (xp, _ptr(layer.packed), _ptr(layer.scale_zero), yp, rows, size, out)
            if layer.kernel_layout:
                self.call = getattr(lib, "int4_blocked_linear" + many)
                self.args = (*common, layer.group_size, layer.block, threads)
            else:
                self.call = getattr(lib, "int4_linear" + many)
                self.args = (*common, layer.group_size, threads)
        self.bias = getattr(layer, "bias", None)
        self.add_into = lib.add_into

    def __call__(self) -> None:
        if self.call is None:
            self.y.copy_(self.layer.run(self.path, self.x[None])[0])
            return
        if self.call(*self.args):
            raise MemoryError("a C kernel could not allocate its scratch buffers")
        if self.bias is not None:
            self.add_into(_ptr(self.y), _ptr(self.bias), self.y.shape[1], self.y.shape[0])


class FastDecoder(nn.Module):
    """`model` with one-token steps of up to MAX_ROWS sequences that share one contiguous fp32
    KVCache (so one length) run through C calls."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._plans = {}  # rows -> buffers and bound calls, built on the first step of that size

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def handles(self, tokens, cache, positions, mask) -> bool:
        return (
            tokens.dim() == 2
            and tokens.shape[1] == 1
            and 1 <= tokens.shape[0] <= MAX_ROWS
            and positions is None
            and mask is None
            and type(cache) is KVCache
            and cache.keys.dtype == torch.float32
            and cache.keys.device.type == "cpu"
            and cache.keys.shape[1] == tokens.shape[0]
            and self.model.embed.weight.dtype == torch.float32
            and not cpu_kernels._switched_off
            and cpu_kernels.library() is not None
        )

    def forward(self, tokens, cache=None, *, positions=None, mask=None, last_only=False):
        if cache is None or not self.handles(tokens, cache, positions, mask):
            return self.model(tokens, cache, positions=positions, mask=mask, last_only=last_only)
        if cache.length + 1 > min(cache.max_tokens, self.model.max_positions):
            return self.model(tokens, cache, last_only=last_only)  # raises the usual error
        return self._step(tokens[:, 0], cache)[:, None]

    def _build(self, rows: int):
        m = self.model
        lib = cpu_kernels.library()
        threads = torch.get_num_threads()
        d = m.embed.weight.shape[1]
        block0 = m.blocks[0]
        heads, kv_heads, head_dim = m.n_heads, m.n_kv_heads, m.head_dim
        d_ff = block0.mlp.d_ff
        buf = {
            name: torch.zeros(rows, size)
            for name, size in {
                "x": d,
                "h": d,
                "qkv": (heads + 2 * kv_heads) * head_dim,
                "attn": heads * head_dim,
                "delta": d,
                "gate_up": 2 * d_ff,
                "act": d_ff,
                "logits": m.lm_head.out_features,
            }.items()
        }
        layers = []
        for block in m.blocks:
            layers.append(
                (
                    block.attn_norm.weight,
                    block.attn_norm.eps,
                    _Matmul(block.attn.qkv, buf["h"], buf["qkv"], lib, threads),
                    _Matmul(block.attn.out, buf["attn"], buf["delta"], lib, threads),
                    block.mlp_norm.weight,
                    block.mlp_norm.eps,
                    _Matmul(block.mlp.gate_up, buf["h"], buf["gate_up"], lib, threads),
                    _Matmul(block.mlp.down, buf["act"], buf["delta"], lib, threads),
                )
            )
        head = _Matmul(m.lm_head, buf["h"], buf["logits"], lib, threads)
        self._plans[rows] = (lib, threads, buf, layers, head)

    @torch.inference_mode()
    def _step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        rows = tokens.shape[0]
        plan = self._plans.get(rows)
        if plan is None or plan[1] != torch.get_num_threads():
            self._build(rows)  # first step of this size, or the thread count changed since
        lib, threads, buf, layers, head = self._plans[rows]
        m = self.model
        heads, kv_heads, head_dim = m.n_heads, m.n_kv_heads, m.head_dim
        d = buf["x"].shape[1]
        position, max_tokens = cache.length, cache.max_tokens
        cos, sin = m.rotary.cos[position], m.rotary.sin[position]
        x, h, qkv, attn, delta = (_ptr(buf[k]) for k in ("x", "h", "qkv", "attn", "delta"))
        torch.index_select(m.embed.weight, 0, tokens, out=buf["x"])
        scratch = torch.empty(rows * heads * (position + 1))
        layer_stride, row_stride = cache.keys.stride(0) * 4, cache.keys.stride(1)
        keys, values = _ptr(cache.keys), _ptr(cache.values)
        residual = None  # the first norm has nothing to add
        for i, (norm1, eps1, qkv_mm, out_mm, norm2, eps2, gate_up_mm, down_mm) in enumerate(layers):
            lib.add_rmsnorm(x, residual, _ptr(norm1), h, rows, d, eps1, threads)
            qkv_mm()
            k_layer, v_layer = keys + i * layer_stride, values + i * layer_stride
            lib.rope_and_store(
                qkv,
                _ptr(cos),
                _ptr(sin),
                heads,
                kv_heads,
                head_dim,
                k_layer,
                v_layer,
                position,
                max_tokens,
                rows,
                row_stride,
                threads,
            )
            lib.attend_one(
                qkv,
                k_layer,
                v_layer,
                attn,
                heads,
                kv_heads,
                head_dim,
                position + 1,
                max_tokens,
                _ptr(scratch),
                threads,
                rows,
                row_stride,
            )
            out_mm()
            lib.add_rmsnorm(x, delta, _ptr(norm2), h, rows, d, eps2, threads)
            gate_up_mm()
            lib.silu_mul(_ptr(buf["gate_up"]), _ptr(buf["act"]), buf["act"].shape[1], rows, threads)
            down_mm()
            residual = delta
        lib.add_rmsnorm(x, delta, _ptr(m.norm.weight), h, rows, d, m.norm.eps, threads)
        head()
        cache.length += 1
        return buf["logits"].clone()


def accelerate(model: nn.Module) -> FastDecoder:
    """`model` wrapped so that one-token decode steps (batch 1 to MAX_ROWS on one KVCache) skip
    PyTorch's per-operation overhead.

    Wrap the model as it will run (after `quantize`): the first step binds its layers' buffers."""
    return FastDecoder(model)
