"""A Llama-family decoder that reads its weights from a transformers model.

The transformers model is the reference: `Transformer.from_hf(hf_model)` copies its weights
(fusing Q/K/V and gate/up), and tests assert that both produce the same logits.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from memwall.engine.kv_cache import KVCache
from memwall.engine.layers import Block, RMSNorm, Rotary
from memwall.engine.linear import Linear
from memwall.machine.step_threads import choose_step_threads


class Transformer(nn.Module):
    def __init__(
        self,
        *,
        vocab_size,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim,
        d_ff,
        max_positions,
        rope_theta,
        eps,
        tied_embeddings=True,
        qkv_bias=False,
    ):
        super().__init__()
        self.n_layers, self.n_heads, self.n_kv_heads = n_layers, n_heads, n_kv_heads
        self.head_dim, self.max_positions = head_dim, max_positions
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, n_kv_heads, head_dim, d_ff, eps, qkv_bias)
            for _ in range(n_layers)
        )
        self.norm = RMSNorm(d_model, eps)
        # A Linear of its own, so that it can be quantized on its own (chapter 7); with tied embeddings
        # from_hf points its weight at the embedding table until then.
        self.lm_head = Linear(d_model, vocab_size)
        self.tied_embeddings = tied_embeddings
        self.rotary = Rotary(head_dim, max_positions, rope_theta)
        # One-token steps on a CPU take fewer threads while another process holds a core: hooks
        # around forward (machine/step_threads.py), which stays as written.
        choose_step_threads(self)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        *,
        positions=None,
        mask=None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """tokens [batch, new_tokens] -> logits [batch, new_tokens (or 1), vocab].

        With a cache the new tokens follow the cached ones; without one they are the whole context.
        """
        batch, new = tokens.shape
        start = cache.length if cache is not None else 0
        if start + new > self.max_positions:
            raise ValueError(
                f"context of {start + new} tokens exceeds the model's {self.max_positions}"
            )
        if positions is None:
            positions = torch.arange(start, start + new, device=tokens.device)
        if mask is None and new > 1:
            mask = causal_mask(new, start, tokens.device)
        x = self.embed(tokens)
        rope = self.rotary(positions, x.dtype)
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, cache, layer, mask)
        if cache is not None:
            cache.commit()
        if last_only:
            x = x[:, -1:]
        return self.lm_head(self.norm(x))

    @classmethod
    def empty_like_hf(cls, hf_model) -> Transformer:
        """An engine with the shapes, dtype and device of a transformers Llama/Mistral/Qwen2-style
        model, its weights not filled in yet (from_hf copies them; engine.sharing reads a file)."""
        cfg = hf_model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        if rope.get("rope_type", "default") not in ("default", None):
            raise ValueError(
                f"rope scaling {rope.get('rope_type')!r} is not implemented in memwall's engine"
            )
        ref = hf_model.model
        param = next(hf_model.parameters())
        qkv_bias = _qkv_bias(ref.layers)
        with torch.device(param.device), _default_dtype(param.dtype):
            model = cls(
                vocab_size=cfg.vocab_size,
                d_model=cfg.hidden_size,
                n_layers=cfg.num_hidden_layers,
                n_heads=cfg.num_attention_heads,
                n_kv_heads=cfg.num_key_value_heads,
                head_dim=head_dim,
                d_ff=cfg.intermediate_size,
                max_positions=cfg.max_position_embeddings,
                rope_theta=rope_theta,
                eps=cfg.rms_norm_eps,
                tied_embeddings=cfg.tie_word_embeddings,
                qkv_bias=qkv_bias,
            )
        return model

    @classmethod
    def from_hf(cls, hf_model) -> Transformer:
        """Copy a transformers Llama/Mistral/Qwen2-style model's weights into this engine."""
        model = cls.empty_like_hf(hf_model)
        ref = hf_model.model
        qkv_bias = model.blocks[0].attn.qkv.bias is not None
        with torch.no_grad():
            model.embed.weight.copy_(ref.embed_tokens.weight)
            if model.tied_embeddings and hf_model.lm_head.weight is ref.embed_tokens.weight:
                # One table for both, as in the source model: quantizing the head (chapter 7) builds
                # a new module, so the embedding is never changed through it.
                model.lm_head.weight = model.embed.weight
            else:
                model.lm_head.set_weight(hf_model.lm_head.weight)
            model.norm.weight.copy_(ref.norm.weight)
            for block, src in zip(model.blocks, ref.layers):
                a = src.self_attn
                block.attn_norm.weight.copy_(src.input_layernorm.weight)
                block.mlp_norm.weight.copy_(src.post_attention_layernorm.weight)
                block.attn.qkv.set_weight(
                    torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]) if qkv_bias else None,
                )
                block.attn.out.set_weight(a.o_proj.weight)
                block.mlp.gate_up.set_weight(
                    torch.cat([src.mlp.gate_proj.weight, src.mlp.up_proj.weight])
                )
                block.mlp.down.set_weight(src.mlp.down_proj.weight)
        return model.eval().requires_grad_(False)

    def new_cache(self, batch: int = 1, max_tokens: int | None = None, dtype=None) -> KVCache:
        return KVCache.for_model(self, batch, max_tokens, dtype)

    def weight_bytes_per_step(self) -> int:
        """Weight bytes one decode step reads: every tensor except the embedding table, of which a
        step reads one row per token (negligible). Counted from the real tensors, so packed
        quantized weights count at their packed size."""
        total = sum(
            t.numel() * t.element_size()
            for name, t in self.state_dict().items()
            if not name.startswith("embed.")
        )
        return total + self.embed.weight.shape[1] * self.embed.weight.element_size()


def _qkv_bias(layers) -> bool:
    """Whether a transformers model's q/k/v projections carry biases (Qwen2's do). Biases anywhere
    else, or on only some layers, have no place in the engine: an error, rather than dropped."""
    names = {
        "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "mlp": ("gate_proj", "up_proj", "down_proj"),
    }
    patterns = {
        tuple(
            f"{part}.{name}"
            for part, projs in names.items()
            for name in projs
            if getattr(getattr(layer, part), name).bias is not None
        )
        for layer in layers
    }
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    if patterns <= {(), qkv} and len(patterns) == 1:
        return patterns == {qkv}
    found = sorted({name for pattern in patterns for name in pattern})
    raise ValueError(
        f"memwall's engine has biases only on q, k and v in every layer (as Qwen2); this model has "
        f"them on {', '.join(found)}, not in that pattern (transformers' attention_bias / mlp_bias "
        "options). Use the transformers model itself for it."
    )


@contextlib.contextmanager
def _default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def causal_mask(new_tokens: int, start: int, device) -> torch.Tensor:
    """True where query i (at position start + i) may attend key j, i.e. j <= start + i."""
    query_pos = torch.arange(start, start + new_tokens, device=device)[:, None]
    key_pos = torch.arange(start + new_tokens, device=device)[None, :]
    return key_pos <= query_pos
