"""Change how many key/value heads a model has: MHA, GQA and MQA from one checkpoint.

In multi-head attention (MHA) every query head has its own key and value head. Multi-query
attention (MQA, Shazeer 2019) keeps the query heads but shares one key/value head between all of
them; grouped-query attention (GQA, Ainslie et al. 2023) sits in between, with each key/value head
serving a group of consecutive query heads. The KV cache stores one key and one value vector per
KV head, so its bytes per token scale with the number of KV heads, and nothing else changes.

Two conversions, both on the fused QKV projection of memwall's engine:

- `pool_kv_heads` (fewer KV heads): average the key and value projections of each group of KV
  heads that merge, as Ainslie et al. do to turn an MHA checkpoint into a GQA one. The keys of the
  pooled head are then the mean of the group's keys (RoPE rotates every head the same way, so
  rotating and averaging commute). The paper follows this with a short "uptraining"; without it the
  model is an approximation and its quality drops.
- `expand_kv_heads` (more KV heads): repeat each KV head for the query heads it already served.
  Every query head sees exactly the keys and values it saw before, so the outputs are unchanged;
  only the cache (and the K/V projection) gets bigger. This is what the model would cost as MHA.

Query heads, the output projection and every other weight stay as they are and are shared with the
original model (not copied), so a converted model costs only its new QKV weights in memory.
"""

from __future__ import annotations

import copy

import torch

from memwall.engine.linear import Linear


def pool_heads(projection: torch.Tensor, n_heads: int, n_groups: int) -> torch.Tensor:
    """Average consecutive heads of a projection into `n_groups` heads.

    projection: [n_heads * head_dim, ...] (a weight [out, in] or a bias [out]); head h holds rows
    h*head_dim ... (h+1)*head_dim - 1. Group g averages heads g*r ... (g+1)*r - 1, r = n_heads / n_groups.
    """
    _check_multiple(n_heads, n_groups)
    head_dim = projection.shape[0] // n_heads
    grouped = projection.reshape(n_groups, n_heads // n_groups, head_dim, *projection.shape[1:])
    return grouped.mean(dim=1).reshape(n_groups * head_dim, *projection.shape[1:])


def repeat_heads(projection: torch.Tensor, n_heads: int, n_new_heads: int) -> torch.Tensor:
    """Repeat each head of a projection n_new_heads / n_heads times, copies next to each other.

    Consecutive query heads share a KV head (query head h uses KV head h // group), so copy j of a
    KV head lands exactly where query heads of its group will look for it.
    """
    _check_multiple(n_new_heads, n_heads)
    head_dim = projection.shape[0] // n_heads
    heads = projection.reshape(n_heads, head_dim, *projection.shape[1:])
    return heads.repeat_interleave(n_new_heads // n_heads, dim=0).reshape(
        n_new_heads * head_dim, *projection.shape[1:]
    )


def pool_kv_heads(model, n_kv_heads: int):
    """A copy of an engine `Transformer` with `n_kv_heads` mean-pooled KV heads (e.g. 3 -> 1 is MQA)."""
    if n_kv_heads >= model.n_kv_heads:
        raise ValueError(
            f"pooling needs fewer KV heads than the model's {model.n_kv_heads}, got {n_kv_heads}; "
            f"use expand_kv_heads for more."
        )
    return _with_kv_heads(model, n_kv_heads, lambda p: pool_heads(p, model.n_kv_heads, n_kv_heads))


def expand_kv_heads(model, n_kv_heads: int):
    """A copy of an engine `Transformer` with each KV head repeated (n_heads of them is MHA).

    Its outputs equal the original's; its cache is n_kv_heads / model.n_kv_heads times larger.
    """
    if n_kv_heads <= model.n_kv_heads:
        raise ValueError(
            f"expanding needs more KV heads than the model's {model.n_kv_heads}, got {n_kv_heads}; "
            f"use pool_kv_heads for fewer."
        )
    return _with_kv_heads(
        model, n_kv_heads, lambda p: repeat_heads(p, model.n_kv_heads, n_kv_heads)
    )


def convert_kv_heads(model, n_kv_heads: int):
    """Pool or expand to `n_kv_heads`, which must divide the number of query heads."""
    valid = [n for n in range(1, model.n_heads + 1) if model.n_heads % n == 0]
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads not in valid:
        raise ValueError(
            f"n_kv_heads must divide the {model.n_heads} query heads; "
            f"choose from {', '.join(map(str, valid))}, got {n_kv_heads!r}."
        )
    if n_kv_heads == model.n_kv_heads:
        return model
    return (pool_kv_heads if n_kv_heads < model.n_kv_heads else expand_kv_heads)(model, n_kv_heads)


def _check_multiple(larger: int, smaller: int) -> None:
    if smaller <= 0 or larger <= 0 or larger % smaller:
        raise ValueError(
            f"head counts {larger} and {smaller} do not divide: the larger must be a "
            f"positive multiple of the smaller."
        )


def _with_kv_heads(model, n_kv_heads: int, convert_kv):
    """A model that shares every tensor with `model` except its new QKV projections."""
    if model.n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide the {model.n_heads} query heads.")
    # deepcopy with every tensor pre-registered in the memo: the module tree is new, the tensors are not.
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    converted = copy.deepcopy(model, memo=shared)
    head_dim = model.head_dim
    q_rows = model.n_heads * head_dim
    for block in converted.blocks:
        old = block.attn.qkv
        weight = old.weight
        q, k, v = weight.split([q_rows, model.n_kv_heads * head_dim, model.n_kv_heads * head_dim])
        new_weight = torch.cat([q, convert_kv(k), convert_kv(v)])
        new_bias = None
        if old.bias is not None:
            qb, kb, vb = old.bias.split(
                [q_rows, model.n_kv_heads * head_dim, model.n_kv_heads * head_dim]
            )
            new_bias = torch.cat([qb, convert_kv(kb), convert_kv(vb)])
        fused = Linear(
            old.in_features,
            new_weight.shape[0],
            bias=new_bias is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        block.attn.qkv = fused.set_weight(new_weight, new_bias)
        block.attn.n_kv_heads = n_kv_heads
    converted.n_kv_heads = n_kv_heads
    return converted.eval().requires_grad_(False)
