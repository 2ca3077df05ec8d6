"""One copy of the weights for the transformers model and the engine built from it.

A chapter keeps the transformers model as the reference the engine must match, so both live in
the same process. `Transformer.from_hf` copies the weights (it fuses q/k/v and gate/up into one
matrix each), which doubles the memory: 2 x 538 MB for SmolLM2-135M in fp32, too much for a
Binder session of 1-2 GB. `share_weights` then points every transformers parameter at a view of
the engine's tensor holding the same numbers (q, k and v are row slices of the fused qkv matrix),
so the transformers copies are freed and both models compute with one set of bytes.

Only tensors with the same shape, dtype and device are shared; a quantized engine layer has no
float weight to share, and its transformers twin keeps its own. Both models must be treated as
read-only afterwards (memwall never writes weights in place: quantization and KV-head conversion
build new modules).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from memwall.engine.linear import Linear


def _rebind(module: nn.Module, name: str, tensor: torch.Tensor | None, released: dict) -> None:
    """Make `module.name` a parameter viewing `tensor`; note the old tensor in `released`."""
    old = getattr(module, name, None)
    if not isinstance(old, torch.Tensor) or not isinstance(tensor, torch.Tensor):
        return
    if (old.shape, old.dtype, old.device) != (tensor.shape, tensor.dtype, tensor.device):
        return
    if old.data_ptr() == tensor.data_ptr():
        return  # already shared
    setattr(module, name, nn.Parameter(tensor, requires_grad=False))
    released[old.data_ptr()] = old.numel() * old.element_size()  # a tied tensor counts once


def _float(layer: nn.Module, name: str) -> torch.Tensor | None:
    """The weight or bias of a plain float engine Linear; None for a quantized layer, whose
    tensors (packed, or dequantized for reference) are not the transformers numbers."""
    return getattr(layer, name, None) if type(layer) is Linear else None


def _split_rows(matrix: torch.Tensor | None, sizes: list[int]) -> list:
    return [None] * len(sizes) if matrix is None else list(torch.split(matrix, sizes, dim=0))


@torch.no_grad()
def share_weights(engine: nn.Module, hf_model: nn.Module) -> int:
    """Point `hf_model`'s weights at `engine`'s (built by `Transformer.from_hf(hf_model)`).

    Returns the bytes that were held twice before (freed once nothing else refers to the old
    tensors, e.g. no autograd graph from an earlier forward pass without torch.no_grad()).
    """
    ref = hf_model.model
    released: dict[int, int] = {}
    share = functools.partial(_rebind, released=released)
    share(ref.embed_tokens, "weight", engine.embed.weight)
    share(hf_model.lm_head, "weight", _float(engine.lm_head, "weight"))
    share(ref.norm, "weight", engine.norm.weight)
    for block, layer in zip(engine.blocks, ref.layers):
        attn, mlp = layer.self_attn, layer.mlp
        share(layer.input_layernorm, "weight", block.attn_norm.weight)
        share(layer.post_attention_layernorm, "weight", block.mlp_norm.weight)
        rows = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = block.attn.qkv
        for proj, weight in zip(projections, _split_rows(_float(qkv, "weight"), rows)):
            share(proj, "weight", weight)
        for proj, bias in zip(projections, _split_rows(_float(qkv, "bias"), rows)):
            share(proj, "bias", bias)
        share(attn.o_proj, "weight", _float(block.attn.out, "weight"))
        gate_up = _float(block.mlp.gate_up, "weight")
        halves = _split_rows(gate_up, [mlp.gate_proj.out_features, mlp.up_proj.out_features])
        share(mlp.gate_proj, "weight", halves[0])
        share(mlp.up_proj, "weight", halves[1])
        share(mlp.down_proj, "weight", _float(block.mlp.down, "weight"))
    return sum(released.values())
