"""The model's forward pass over a static KV cache, with every shape fixed by the buffers.

The same arithmetic as the readable `Transformer.forward` (and the readable layers' own modules
and weights: norms, linears, rotary tables), rearranged so that nothing depends on a Python
number that changes from step to step: the cache slots to write and the positions to rotate by
arrive as tensors, the new keys and values are written in place with `index_copy_`, and attention
covers all of the slots it is given under a mask (a decode step through the readable engine's own
`attend`). A compiler can then trace one decode step once and a CUDA graph can replay it for every
later token (gpt-fast's recipe); `runner.py` does both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memwall.engine.layers import attend, rotate


def attend_many(q, keys, values, visible):
    """Attention of several new queries (a prefill, a verify pass) q [rows, heads, T, d] over
    keys, values [rows, kv_heads, slots, d] where `visible` [rows or 1, 1, T, slots] allows.

    The key and value heads are repeated up to the query heads first: on a GPU, PyTorch's fused
    attention kernels take a mask only when the heads match, and with grouped heads and a mask
    SDPA falls back to its unfused kernel, which holds a [T, slots] score matrix per head
    (gigabytes for a long prompt). The repeated copies hold [slots, d] per head."""
    group = q.shape[1] // keys.shape[1]
    keys, values = (t.repeat_interleave(group, dim=1) for t in (keys, values))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible)


def forward_static(
    model,
    tokens: torch.Tensor,
    positions: torch.Tensor | None,
    slots: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    extra_mask: torch.Tensor | None = None,
    last_only: bool = False,
) -> torch.Tensor:
    """tokens [rows, T] at rotary `positions` [rows, T] (None: the slots' numbers), written to
    cache `slots` [T] of keys/values (one [rows, kv_heads, max_tokens, head_dim] tensor per
    layer) -> logits [rows, T (or 1), vocab].

    A new token sees the slots up to its own (causal within the T new tokens); `extra_mask`
    [rows, 1, T, max_tokens] (False hides a slot) narrows that further, e.g. for left padding.
    """
    rows, new = tokens.shape
    max_tokens = keys[0].shape[2]
    visible = torch.arange(max_tokens, device=tokens.device) <= slots[:, None]  # [T, max_tokens]
    visible = visible[None, None]
    if extra_mask is not None:
        visible = visible & extra_mask
    if positions is None:  # made here, inside the graph: no tensor built per step outside it
        positions = slots[None].expand(rows, new)
    x = model.embed(tokens)
    cos = model.rotary.cos[positions].to(x.dtype)[:, None]  # [rows, 1, T, head_dim]
    sin = model.rotary.sin[positions].to(x.dtype)[:, None]

    def remember(layer, k, v):  # in place: the buffers keep their addresses
        keys[layer].index_copy_(2, slots, k.to(keys[layer].dtype))
        values[layer].index_copy_(2, slots, v.to(values[layer].dtype))
        return keys[layer], values[layer]

    x = layers_over_cache(model, x, cos, sin, visible, remember)
    if last_only:
        x = x[:, -1:]
    return model.lm_head(model.norm(x))


def layers_over_cache(model, x, cos, sin, visible, remember):
    """The model's blocks over hidden states x [rows, T, d_model]; `remember(layer, k, v)` writes
    a layer's new keys and values [rows, kv_heads, T, head_dim] into the cache and returns the
    keys and values that attention reads, slot for slot as `visible` [rows or 1, 1, T, slots]."""
    for layer, block in enumerate(model.blocks):
        attn, h = block.attn, block.attn_norm(x)
        rows, new, _ = h.shape
        heads = attn.qkv(h).view(rows, new, attn.n_heads + 2 * attn.n_kv_heads, attn.head_dim)
        qk, v = heads.transpose(1, 2).split([attn.n_heads + attn.n_kv_heads, attn.n_kv_heads], 1)
        q, k = rotate(qk, cos, sin).split([attn.n_heads, attn.n_kv_heads], dim=1)
        keys, values = remember(layer, k, v)
        attention = attend if new == 1 else attend_many
        y = attention(q, keys.to(q.dtype), values.to(q.dtype), visible)
        x = x + attn.out(y.transpose(1, 2).reshape(rows, new, attn.n_heads * attn.head_dim))
        x = x + block.mlp(block.mlp_norm(x))
    return x


def pad_rows(t: torch.Tensor, rows: int, value=0) -> torch.Tensor:
    """`t` with its first dimension padded to `rows` (a no-op when it already has them)."""
    missing = rows - t.shape[0]
    if missing <= 0:
        return t
    return torch.cat([t, t.new_full((missing, *t.shape[1:]), value)])


def widen_mask(
    mask: torch.Tensor, batch: int, rows: int, new: int, max_tokens: int
) -> torch.Tensor:
    """A caller's mask in the readable engine's form ([T, keys] or [batch, 1, T, keys], keys =
    length + T) as [rows, 1, T, max_tokens]: the slots past `keys` are hidden (not written yet)."""
    if mask.dim() == 2:
        mask = mask[None, None]
    mask = F.pad(mask, (0, max_tokens - mask.shape[-1]), value=False)
    mask = mask.expand(batch, 1, new, max_tokens)
    # A padded row sees slot 0 only, so that no softmax row is empty (NaN would not stay there,
    # but it would show up in any check of the padded logits).
    padding = torch.zeros(1, 1, new, max_tokens, dtype=torch.bool, device=mask.device)
    padding[..., 0] = True
    return torch.cat([mask, padding.expand(rows - mask.shape[0], 1, new, max_tokens)])
