"""The building blocks of a Llama-family decoder, written out in plain PyTorch.

RMSNorm (Zhang & Sennrich 2019), rotary position embeddings (Su et al. 2021), grouped-query
attention (Ainslie et al. 2023) and the SwiGLU MLP (Shazeer 2020). Q/K/V are one fused matmul and
gate/up another: the same bytes as separate projections, but fewer kernel launches per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memwall.engine.linear import Linear


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # skip the casts: each op costs several microseconds in decode
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        # Normalise in fp32 even for bf16 activations, as the reference implementation does.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """Precomputed cos/sin tables; position p rotates each (i, i + d/2) pair by p * theta^(-2i/d)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The (cos, sin) rows for `positions` ([tokens] or [batch, tokens]), shaped to broadcast
        over [batch, heads, tokens, head_dim]. Looked up once per forward, shared by all layers."""
        cos, sin = self.cos[positions].to(dtype), self.sin[positions].to(dtype)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool = False
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.qkv = Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)
        self.out = Linear(n_heads * head_dim, d_model)

    def forward(self, x, rope, cache, layer: int, mask=None):
        batch, tokens, _ = x.shape
        heads = (
            self.qkv(x)
            .view(batch, tokens, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
            .transpose(1, 2)
        )
        qk, v = heads.split([self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = rotate(qk, *rope).split(
            [self.n_heads, self.n_kv_heads], dim=1
        )  # one rotation for q and k
        if cache is not None:
            k, v = cache.update(layer, k, v)  # all cached keys/values so far, this step's included
        y = attend(q, k, v, mask)
        return self.out(y.transpose(1, 2).reshape(batch, tokens, self.n_heads * self.head_dim))


def attend(q, k, v, mask=None):
    """Softmax attention where several query heads share each key/value head (GQA; MQA if one).

    mask: None means "every query sees every key" (a decode step); otherwise a boolean
    [tokens, keys] or [batch, 1, tokens, keys] tensor that is True where attention is allowed.
    """
    batch, heads, tokens, head_dim = q.shape
    kv_heads = k.shape[1]
    if tokens == 1 and (mask is None or mask.dim() == 4):
        # Decode: group the query heads that share a KV head, so each K/V head is read once
        # (no copies), and skip the fused kernel, whose fixed cost is large for one query.
        q = q.view(batch, kv_heads, heads // kv_heads, head_dim)
        scores = (q @ k.transpose(-1, -2)) * head_dim**-0.5
        if (
            mask is not None
        ):  # batched decode of sequences with different lengths: [batch, 1, 1, keys]
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return (weights @ v).view(batch, heads, 1, head_dim)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.d_ff = d_ff
        self.gate_up = Linear(d_model, 2 * d_ff)
        self.down = Linear(d_ff, d_model)

    def forward(self, x):
        gate, up = self.gate_up(x).split(self.d_ff, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, head_dim, d_ff, eps, qkv_bias=False):
        super().__init__()
        self.attn_norm = RMSNorm(d_model, eps)
        self.attn = Attention(d_model, n_heads, n_kv_heads, head_dim, qkv_bias)
        self.mlp_norm = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x, rope, cache, layer, mask=None):
        x = x + self.attn(self.attn_norm(x), rope, cache, layer, mask)
        return x + self.mlp(self.mlp_norm(x))
