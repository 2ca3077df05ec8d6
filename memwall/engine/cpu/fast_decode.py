"""Decode without PyTorch's per-operation overhead: the same model, run by C calls.

A decode step of a small model is hundreds of small PyTorch operations. Each costs microseconds of
dispatch, so on a fast CPU the step can be bound by overhead, not by reading the weights (chapter
2's third regime). `accelerate(model)` gives a readable `Transformer` (fp32, int8 or int4 linears)
CPU twins for its linear layers (`linears.py`) and wraps it so that a one-token step, for one
sequence or a batch on one KVCache, or a batch of the scheduler's on its PagedKVCache (each row at
its own position), runs its layers in one call into memwall's C library (decode_step.h), on
buffers allocated once per batch size: per layer a fused residual-add and RMSNorm, the matmuls on
the paths `path_choice.choose` picked for that many rows, rotary embedding and the cache write in
one op, attention of one query per sequence (each chunk of cached keys and values read once for
the query heads that share it, the paged cache's blocks read in place through its block tables),
SiLU times up. A matmul whose chosen path is PyTorch's is called back in Python. Everything else
(prefill, bf16) runs the twins through the readable model's own code, which stays the reference:
tests check that both give the same tokens and logits.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from memwall.engine.cpu import kernels, path_choice
from memwall.engine.cpu.build import LayerSpec, MatmulElsewhere, MatmulSpec
from memwall.engine.cpu.linears import with_twins
from memwall.engine.kv_cache import KVCache
from memwall.engine.paged_cache import PagedKVCache
from memwall.machine.cores import usable_cores
from memwall.machine.step_threads import ThreadChoice

MAX_ROWS = 64  # sequences per step; the matmul path for each row count is chosen by measurement


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class _Matmul:
    """y = layer(x) for fp32 rows, bound once to buffers: `spec` says how (decode_step.h), on a C
    kernel or, for the path `path_choice.choose` picked elsewhere, the layer's own path in Python."""

    def __init__(self, layer, x: torch.Tensor, y: torch.Tensor, matmul_id: int):
        self.layer, self.x, self.y = layer, x, y
        self.path = path_choice.choose(layer, x, fast_step=True)
        self.spec = layer.matmul_spec(self.path, matmul_id)
        # The "packed" path reads a copy of the weights: it is kept alive with the spec that
        # points to it, and an in-place change of the weights (a new version) makes it stale.
        packed = self.spec.kind == MatmulSpec.FP32_PACKED
        self.panels = kernels.panels_of(layer.weight) if packed else None
        self.version = kernels.version_of(layer.weight) if packed else None

    def stale(self) -> bool:
        return self.panels is not None and kernels.version_of(self.layer.weight) != self.version

    def run_elsewhere(self) -> None:
        self.y.copy_(self.layer.run(self.path, self.x[None])[0])


class _Plan:
    """The buffers and matmul specs of steps with one row count, and the callback through which C
    runs a matmul on a path of its own (an exception there is kept and raised after the call)."""

    def __init__(self, lib, threads: int, buf: dict, layers, matmuls: list, shape: tuple):
        self.lib, self.threads, self.buf = lib, threads, buf
        # how many of them each step uses: fewer while another process holds a core
        # (memwall/machine/step_threads.py)
        self.thread_choice = ThreadChoice(min(threads, usable_cores()))
        self.layers, self.matmuls, self.shape = layers, matmuls, shape
        rows = buf["x"].shape[0]
        # a KVCache's rows as the C step sees caches: one block each, all at one position
        self.own_block = torch.arange(rows)[:, None]
        self.positions = torch.zeros(rows, dtype=torch.long)
        self.packed = [matmul for matmul in matmuls if matmul.panels is not None]
        self.buffers = tuple(  # decode_layers' buffer arguments, in its order
            _ptr(buf[name]) for name in ("x", "h", "qkv", "attn", "delta", "gate_up", "act")
        )
        failures = self.failures = []

        def run_elsewhere(matmul_id: int) -> None:
            try:
                matmuls[matmul_id].run_elsewhere()
            except BaseException as error:  # raising into C would lose it: kept for later
                failures.append(error)

        # Not a bound method: the plan would then hold itself through the callback, and a
        # dropped model would wait for the cyclic garbage collector to free its weights.
        self.elsewhere = MatmulElsewhere(run_elsewhere)

    def stale(self) -> bool:
        return any(matmul.stale() for matmul in self.packed)

    def run(self, matmul: _Matmul, threads: int | None = None) -> None:
        """One matmul alone (the output head; benchmarks time them all without the rest)."""
        rows = matmul.x.shape[0]
        threads = threads or self.threads
        status = self.lib.run_matmul(
            matmul.spec, _ptr(matmul.x), _ptr(matmul.y), rows, threads, self.elsewhere
        )
        self.raise_failure(status)

    def raise_failure(self, status: int) -> None:
        if self.failures:
            failure = self.failures[0]
            self.failures.clear()
            raise failure
        if status:
            raise MemoryError("a C kernel could not allocate its scratch buffers")


class FastDecoder(nn.Module):
    """`model` with one-token steps of up to MAX_ROWS sequences run by memwall's C library: on one
    contiguous fp32 KVCache (one length), or on a PagedKVCache after `begin(seq_ids, 1)`."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._plans = {}  # rows -> buffers and bound calls, built on the first step of that size
        self.fused_steps = 0  # steps that ran in C (the others ran the readable model's code)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def fallback_reason(self, cache) -> str | None:
        """Why one-token steps on `cache` go to the readable model; None when they run in C."""
        if not kernels.available():
            return kernels.unavailable_reason() or "memwall's CPU kernels are switched off"
        if not (
            type(cache) in (KVCache, PagedKVCache)
            and cache.keys.dtype == torch.float32
            and cache.keys.device.type == "cpu"
            and cache.keys.is_contiguous()
            and self.model.embed.weight.dtype == torch.float32
        ):
            return "the fast path takes fp32 models with a KV cache (plain or paged) in CPU memory"
        return None

    def handles(self, tokens, cache, positions, mask) -> bool:
        """Whether this step runs in C. A paged cache's batch is the one begin() reserved one new
        token for, whose positions and mask its block tables and lengths imply."""
        if not (
            tokens.dim() == 2
            and tokens.shape[1] == 1
            and 1 <= tokens.shape[0] <= MAX_ROWS
            and self.fallback_reason(cache) is None
        ):
            return False
        if type(cache) is KVCache:
            return positions is None and mask is None and cache.keys.shape[1] == tokens.shape[0]
        return (
            cache.batch_tables is not None
            and cache.new_tokens == 1
            and cache.batch_tables.shape[0] == tokens.shape[0]
            and cache.implies(positions, mask)
        )

    def forward(self, tokens, cache=None, *, positions=None, mask=None, last_only=False):
        if cache is None or not self.handles(tokens, cache, positions, mask):
            return self.model(tokens, cache, positions=positions, mask=mask, last_only=last_only)
        room = cache.max_tokens if type(cache) is KVCache else self.model.max_positions
        if cache.length + 1 > min(room, self.model.max_positions):  # raises the usual error
            return self.model(tokens, cache, positions=positions, mask=mask, last_only=last_only)
        return self._step(tokens[:, 0], cache)[:, None]

    def _build(self, rows: int):
        m = self.model
        d = m.embed.weight.shape[1]
        d_ff = m.blocks[0].mlp.d_ff
        buf = {
            name: torch.zeros(rows, size)
            for name, size in {
                "x": d,
                "h": d,
                "qkv": (m.n_heads + 2 * m.n_kv_heads) * m.head_dim,
                "attn": m.n_heads * m.head_dim,
                "delta": d,
                "gate_up": 2 * d_ff,
                "act": d_ff,
                "logits": m.lm_head.out_features,
            }.items()
        }
        matmuls, layers = [], (LayerSpec * len(m.blocks))()
        for block, spec in zip(m.blocks, layers):
            for name, layer, x, y in (
                ("qkv", block.attn.qkv, "h", "qkv"),
                ("out", block.attn.out, "attn", "delta"),
                ("gate_up", block.mlp.gate_up, "h", "gate_up"),
                ("down", block.mlp.down, "act", "delta"),
            ):
                matmuls.append(_Matmul(layer, buf[x], buf[y], len(matmuls)))
                setattr(spec, name, matmuls[-1].spec)
            spec.norm1, spec.eps1 = _ptr(block.attn_norm.weight), block.attn_norm.eps
            spec.norm2, spec.eps2 = _ptr(block.mlp_norm.weight), block.mlp_norm.eps
        matmuls.append(_Matmul(m.lm_head, buf["h"], buf["logits"], len(matmuls)))
        shape = (m.n_heads, m.n_kv_heads, m.head_dim, d, d_ff)
        self._plans[rows] = _Plan(
            kernels.library(), torch.get_num_threads(), buf, layers, matmuls, shape
        )

    @torch.inference_mode()
    def _step(self, tokens: torch.Tensor, cache: KVCache | PagedKVCache) -> torch.Tensor:
        rows = tokens.shape[0]
        plan = self._plans.get(rows)
        if plan is None or plan.threads != torch.get_num_threads() or plan.stale():
            self._build(rows)  # first step of this size, or the threads or weights changed since
            plan = self._plans[rows]
        m = self.model
        longest = cache.length + 1  # the longest row's context, this step's token included
        if type(cache) is KVCache:
            plan.positions.fill_(cache.length)
            positions, tables, block_size = plan.positions, plan.own_block, cache.max_tokens
        else:
            positions, tables = cache.batch_starts, cache.batch_tables
            block_size = cache.blocks.block_size
        torch.index_select(m.embed.weight, 0, tokens, out=plan.buf["x"])
        scratch = torch.empty(plan.lib.attend_scratch_floats(rows, m.n_heads, m.head_dim, longest))
        threads = plan.thread_choice.threads()
        start = time.perf_counter()
        status = plan.lib.decode_layers(
            plan.layers,
            len(plan.layers),
            _ptr(m.norm.weight),
            m.norm.eps,
            *plan.buffers,
            _ptr(m.rotary.cos),
            _ptr(m.rotary.sin),
            _ptr(cache.keys),
            _ptr(cache.values),
            cache.keys.stride(0),
            _ptr(positions),
            _ptr(tables),
            tables.shape[1],
            block_size,
            *plan.shape,
            _ptr(scratch),
            rows,
            threads,
            plan.elsewhere,
        )
        plan.raise_failure(status)
        plan.run(plan.matmuls[-1], threads)  # the output head
        plan.thread_choice.record(threads, time.perf_counter() - start)
        if type(cache) is KVCache:
            cache.length += 1
        else:
            cache.commit()
        self.fused_steps += 1
        return plan.buf["logits"].clone()


def accelerate(model: nn.Module) -> FastDecoder:
    """A new model over `model`'s weights whose linear layers are CPU twins and whose one-token
    decode steps (batch 1 to MAX_ROWS on one KVCache or a PagedKVCache) skip PyTorch's
    per-operation overhead.

    Accelerate the model as it will run (after `quantize`): the first step binds its buffers."""
    return FastDecoder(with_twins(model))
