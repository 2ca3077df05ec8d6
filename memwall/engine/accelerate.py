"""`accelerate(model)`: the one door from the readable engine to a machine's speed path.

The readable engine (`model`, `layers`, `linear`, `quant`, ...) is the textbook: plain PyTorch,
the reference every speed path is tested against. Each kind of device has its speed path in a
backend beside it, as gpt-fast and nano-vllm keep theirs: `engine/cpu/` (C kernels chosen by
measurement, a decode step fused in C). `accelerate` picks the backend from the device the
weights live on and returns a new module that shares those weights; the one passed in is left as
it was. A whole model gets faster decode steps; a single linear layer (chapters compare kernels
on one matrix) gets its twin, whose `paths_for(x)` names the kernels that can take `x` and whose
`run(path, x)` computes through one of them.
"""

from __future__ import annotations

from torch import nn


def accelerate(module: nn.Module) -> nn.Module:
    """`module` (a model, or one linear layer) with its device's speed path applied: the same
    weights, the same outputs up to rounding."""
    from memwall.engine.cpu import fast_decode, linears

    # Until a GPU backend exists, the CPU backend wraps models on other devices too: its twins
    # and its fused step then hand every call to the readable code (`fallback_reason` says why).
    if type(module) in linears.TWINS:
        return linears.twin_of(module)
    return fast_decode.accelerate(module)


def speed_path() -> dict:
    """What `accelerate` can use on this machine: {"backend", "kernels" (the C variant in use, or
    None), "reason" (why there are none), "vnni" (int8 dot products in hardware)}."""
    from memwall.engine.cpu import kernels

    variant = kernels.variant() if kernels.available() else None
    return {
        "backend": "cpu",
        "kernels": variant,
        "reason": None if variant else kernels.unavailable_reason() or "switched off",
        "vnni": bool(variant) and kernels.has_vnni(),
    }
