"""One copy of the weights for the transformers model and the engine built from it.

A chapter keeps the transformers model as the reference the engine must match, so both live in
the same process. `Transformer.from_hf` copies the weights (it fuses q/k/v and gate/up into one
matrix each), which doubles the memory: 2 x 538 MB for SmolLM2-135M in fp32, too much for a
Binder session of 1-2 GB. `share_weights` then points every transformers parameter at a view of
the engine's tensor holding the same numbers (q, k and v are row slices of the fused qkv matrix),
so the transformers copies are freed and both models compute with one set of bytes.
`shared_engine(hf_model)` does both, reading the checkpoint straight into the engine when it can,
so that the two copies are not even briefly resident together:

    hf_model, tokenizer = models.load("smollm2-135m")
    engine = shared_engine(hf_model)        # instead of Transformer.from_hf(hf_model)

Only tensors with the same shape, dtype and device are shared; a quantized engine layer has no
float weight to share, and its transformers twin keeps its own. Both models must be treated as
read-only afterwards (memwall never writes weights in place: quantization and KV-head conversion
build new modules).
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

import torch
from torch import nn

from memwall.engine.linear import Linear


def _rebind(
    module: nn.Module, name: str, tensor: torch.Tensor | None, released: dict, made: dict
) -> None:
    """Make `module.name` a parameter viewing `tensor`; note the old tensor in `released`.

    `made` holds the parameter already made for an engine tensor: a tied head and its embedding
    get the same one, so they stay one parameter (counted once by `parameters()`, kept tied by a
    copy), as they were in the transformers model."""
    old = getattr(module, name, None)
    if not isinstance(old, torch.Tensor) or not isinstance(tensor, torch.Tensor):
        return
    if (old.shape, old.dtype, old.device) != (tensor.shape, tensor.dtype, tensor.device):
        return
    if old.data_ptr() == tensor.data_ptr():
        return  # already shared
    key = (tensor.data_ptr(), tensor.shape, tensor.stride())  # the same bytes seen the same way
    if key not in made:
        made[key] = nn.Parameter(tensor, requires_grad=False)
    setattr(module, name, made[key])
    released[old.data_ptr()] = old.numel() * old.element_size()  # a tied tensor counts once


def _float(layer: nn.Module, name: str) -> torch.Tensor | None:
    """The weight or bias of a plain float engine Linear; None for a quantized layer, whose
    tensors (packed, or dequantized for reference) are not the transformers numbers."""
    return getattr(layer, name, None) if type(layer) is Linear else None


def _split_rows(matrix: torch.Tensor | None, sizes: list[int]) -> list:
    return [None] * len(sizes) if matrix is None else list(torch.split(matrix, sizes, dim=0))


def weight_pairs(engine: nn.Module, hf_model: nn.Module):
    """(transformers module, attribute, engine tensor with the same numbers) for every weight the
    two models have in common; q/k/v and gate/up are row slices of the engine's fused matrices."""
    ref = hf_model.model
    yield ref.embed_tokens, "weight", engine.embed.weight
    yield hf_model.lm_head, "weight", _float(engine.lm_head, "weight")
    yield ref.norm, "weight", engine.norm.weight
    for block, layer in zip(engine.blocks, ref.layers):
        attn, mlp = layer.self_attn, layer.mlp
        yield layer.input_layernorm, "weight", block.attn_norm.weight
        yield layer.post_attention_layernorm, "weight", block.mlp_norm.weight
        rows = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = block.attn.qkv
        for proj, weight in zip(projections, _split_rows(_float(qkv, "weight"), rows)):
            yield proj, "weight", weight
        for proj, bias in zip(projections, _split_rows(_float(qkv, "bias"), rows)):
            yield proj, "bias", bias
        yield attn.o_proj, "weight", _float(block.attn.out, "weight")
        gate_up = _float(block.mlp.gate_up, "weight")
        halves = _split_rows(gate_up, [mlp.gate_proj.out_features, mlp.up_proj.out_features])
        yield mlp.gate_proj, "weight", halves[0]
        yield mlp.up_proj, "weight", halves[1]
        yield mlp.down_proj, "weight", _float(block.mlp.down, "weight")


@torch.no_grad()
def share_weights(engine: nn.Module, hf_model: nn.Module) -> int:
    """Point `hf_model`'s weights at `engine`'s (built by `Transformer.from_hf(hf_model)`).

    Returns the bytes that were held twice before (freed once nothing else refers to the old
    tensors, e.g. no autograd graph from an earlier forward pass without torch.no_grad()).
    """
    released: dict[int, int] = {}
    made: dict[tuple, nn.Parameter] = {}
    for module, name, tensor in weight_pairs(engine, hf_model):
        _rebind(module, name, tensor, released, made)
    return sum(released.values())


# ---- building the engine straight from the checkpoint ------------------------------------------

_FILE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


class _CannotRead(Exception):
    """The checkpoint does not hold exactly what the engine needs; copy from the model instead."""


def _safetensors_index(path: Path) -> tuple[dict, int]:
    """The header of a .safetensors file (name -> dtype, shape, byte range) and where data starts."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return header, 8 + length


def _read_into(file, start: int, entry: dict, tensor: torch.Tensor) -> int:
    if _FILE_DTYPES.get(entry["dtype"]) != tensor.dtype or list(entry["shape"]) != list(
        tensor.shape
    ):
        raise _CannotRead(f"{entry['dtype']} {entry['shape']} vs {tensor.dtype} {tensor.shape}")
    begin, end = entry["data_offsets"]
    target = tensor.view(torch.uint8).reshape(-1).numpy()  # the engine's bytes, writable
    file.seek(start + begin)
    if end - begin != target.nbytes or file.readinto(memoryview(target)) != target.nbytes:
        raise _CannotRead("short read")
    return target.nbytes


@torch.no_grad()
def _engine_from_checkpoint(hf_model: nn.Module, path: Path):
    from memwall.engine.model import Transformer

    if next(hf_model.parameters()).device.type != "cpu":
        raise _CannotRead("the model is not on the CPU")  # file reads land in CPU memory
    header, start = _safetensors_index(path)
    engine = Transformer.empty_like_hf(hf_model).requires_grad_(False)
    tied = engine.tied_embeddings and hf_model.lm_head.weight is hf_model.model.embed_tokens.weight
    if tied:
        engine.lm_head.weight = engine.embed.weight
    names = {id(module): name for name, module in hf_model.named_modules()}
    filled = 0
    with open(path, "rb", buffering=0) as file:
        for module, attr, tensor in weight_pairs(engine, hf_model):
            if tensor is None or (tied and module is hf_model.lm_head):
                continue  # no bias here / the tied head is the embedding, read once
            key = f"{names[id(module)]}.{attr}"
            if key not in header:
                raise _CannotRead(f"{key} is not in {path.name}")
            filled += _read_into(file, start, header[key], tensor)
    expected = sum(t.numel() * t.element_size() for t in engine.parameters())  # tied: once
    if filled != expected:
        raise _CannotRead(f"read {filled} of {expected} bytes")
    share_weights(engine, hf_model)
    return engine.eval().requires_grad_(False)


def shared_engine(hf_model: nn.Module):
    """An engine for `hf_model` that shares its weights: `Transformer.from_hf` + `share_weights`,
    with a lower peak when the model was loaded from a single local .safetensors file.

    from_hf reads every weight through transformers' memory map of the file, so for a moment the
    mapped file and the engine's copy are both resident (about 1.2 GB for SmolLM2-135M in fp32).
    Reading the file straight into the engine's (fused) tensors with plain reads, and then
    pointing the transformers model at them, never holds the two at once.
    """
    from memwall.engine.model import Transformer

    path = Path(str(getattr(hf_model, "name_or_path", "") or "")) / "model.safetensors"
    if path.is_file():
        try:
            return _engine_from_checkpoint(hf_model, path)
        except (_CannotRead, OSError, ValueError, KeyError):
            pass  # e.g. a different dtype than the file's, or a layout this reader does not know
    engine = Transformer.from_hf(hf_model)
    share_weights(engine, hf_model)
    return engine


def cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A copy of `model` with every float tensor in `dtype`, converted tensor by tensor.

    `copy.deepcopy(model).to(dtype)` would first hold a second full-precision copy (538 MB more
    for SmolLM2-135M in fp32); here each tensor is converted straight into the copy, and a tensor
    two modules share (a tied head) stays shared."""
    return copy_with(model, lambda t: t.detach().to(dtype) if t.is_floating_point() else None)


def copy_with(model: nn.Module, convert) -> nn.Module:
    """A copy of `model` in which each tensor (parameter or buffer) is `convert(tensor)`, made one
    tensor at a time; a tensor two modules share stays shared, and one for which convert returns
    None is copied as deepcopy copies it."""
    converted = {}
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) in converted:
            continue
        new = convert(tensor)
        if new is not None:
            is_parameter = isinstance(tensor, nn.Parameter)
            converted[id(tensor)] = nn.Parameter(new, requires_grad=False) if is_parameter else new
    return copy.deepcopy(model, memo=converted)
