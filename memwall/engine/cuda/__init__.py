"""The GPU's speed path, beside the readable engine and applied only by `accelerate(model)`.

A decode step on a GPU is not bound by the weights' bytes but by launching its kernels one by one
from Python (chapter 2's overhead regime); gpt-fast and nano-vllm show the cure, kept here in a
few small files:
- `static_cache.py`: a KV cache allocated once, written in place at slots given as tensors;
- `step.py`: the forward pass over that cache with every shape fixed, so it can be traced;
- `runner.py`: the decode step compiled with `torch.compile(mode="reduce-overhead")` and replayed
  as a CUDA graph per batch size (batches padded to the next captured size);
- `paged.py`: the same for the server's scheduler, whose decode steps run on a paged cache
  (block tables as tensors, a scratch block for the padded rows);
- `int4.py`: int4 layers through PyTorch's tinygemm kernel, which reads the packed bytes. int8
  needs no twin: its readable forward (codes cast, multiplied, scaled) is a form the compiler fuses.

`compiled(model)` builds the same thing on any device; on a CPU it is how tests check this path
against the readable engine without a GPU.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from memwall.engine.cuda.int4 import TinyGemmInt4Linear, unsupported_reason
from memwall.engine.cuda.runner import BATCH_SIZES, CompiledDecoder, padded_rows
from memwall.engine.cuda.static_cache import StaticKVCache
from memwall.engine.quant import Int4Linear

__all__ = [
    "BATCH_SIZES",
    "CompiledDecoder",
    "StaticKVCache",
    "TinyGemmInt4Linear",
    "compiled",
    "native_half_dtype",
    "padded_rows",
    "with_twins",
]


def with_twins(model: nn.Module, int4: bool = True) -> nn.Module:
    """A new module tree over `model`'s tensors with each `Int4Linear` that tinygemm can take
    swapped for its twin (the others, and everything else, are shared as they are)."""
    swaps = {
        name: module
        for name, module in model.named_modules()
        if int4 and isinstance(module, Int4Linear) and unsupported_reason(module) is None
    }
    if not swaps:
        return model
    target = tree_over(model)
    for name, module in swaps.items():
        parent, _, attr = name.rpartition(".")
        setattr(target.get_submodule(parent), attr, TinyGemmInt4Linear(module))
    return target


def compiled(
    model: nn.Module,
    *,
    mode: str | None = "reduce-overhead",
    int4: bool = True,
    compile_backend: str | None = None,
) -> CompiledDecoder:
    """`model` (a readable `Transformer`, quantized or not) with compiled decode steps on the
    static cache its `new_cache` makes; CUDA graphs where the weights are on a GPU.

    int4: route int4 layers through tinygemm where it takes them; compile_backend: torch.compile's
    backend (default inductor; tests may pass a cheaper one to check the tracing alone)."""
    if isinstance(model, CompiledDecoder):
        return model
    if not all(hasattr(model, name) for name in ("blocks", "rotary", "new_cache")):
        raise ValueError(
            f"the compiled path takes a memwall Transformer, not {type(model).__name__}"
        )
    model = with_twins(model, int4)
    device = next(model.parameters()).device
    native_bf16 = native_half_dtype(device) == torch.bfloat16
    if not native_bf16:
        model = with_bf16_buffers_widened(model)
    decoder = CompiledDecoder(model, mode=mode, backend=compile_backend)
    if not native_bf16 and any(p.dtype == torch.bfloat16 for p in model.parameters()):
        # The compiler would skip the step, and its code for every model after (running it in
        # pieces, without one graph).
        decoder.compile_failure = (
            f"{device} computes in bf16 only by emulation, and the compiler takes no bf16 step "
            "there: load the model in fp16 (memwall's default on this GPU)"
        )
        warnings.warn(
            f"memwall: the compiled decode step runs uncompiled ({decoder.compile_failure})",
            RuntimeWarning,
            stacklevel=2,
        )
    return decoder


def with_bf16_buffers_widened(model: nn.Module) -> nn.Module:
    """A new module tree over `model`'s tensors in which each bf16 buffer (the quantized layers'
    scales and offsets: a few bytes a row or group) is an fp32 copy, exactly equal.

    For a GPU without native bf16 (before compute capability 8.0: a T4, a V100), whose compiler
    refuses a graph with a bf16 input, and then skips the step's code for the rest of the process.
    The layers cast their scales to the activations' dtype (or to fp32) either way, so the outputs
    do not change."""
    widened = {id(b): b.float() for b in model.buffers() if b.dtype == torch.bfloat16}
    return tree_over(model, widened) if widened else model


def tree_over(model: nn.Module, replaced: dict | None = None) -> nn.Module:
    """New modules over `model`'s tensors, those in `replaced` (id -> tensor) swapped for others."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo={**shared, **(replaced or {})})


def native_half_dtype(device) -> torch.dtype:
    """bf16 where the GPU computes in it natively (compute capability 8.0 on), else fp16 (a T4,
    a V100): there bf16 is emulated, and far slower than fp16 at the same bytes."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return torch.float16
    return torch.bfloat16
