"""`accelerate(model)`: the one door from the readable engine to a machine's speed path.

The readable engine (`model`, `layers`, `linear`, `quant`, ...) is the textbook: plain PyTorch,
the reference every speed path is tested against. Each kind of device has its speed path in a
backend beside it, as gpt-fast and nano-vllm keep theirs: `engine/cpu/` (C kernels chosen by
measurement, a decode step fused in C) and `engine/cuda/` (a static KV cache and the decode step
compiled into CUDA graphs, int4 through tinygemm). `accelerate` picks the backend from the device
the weights live on and returns a new module that shares those weights (int4 layers on a GPU get
tinygemm's own copy of their codes: let the model passed in go to free its); the one passed in is
left as it was. A whole model gets faster decode steps; on a CPU a single linear layer (chapters
compare kernels on one matrix) gets its twin, whose `paths_for(x)` names the kernels that can
take `x` and whose `run(path, x)` computes through one of them.

`backend="compiled"` applies the CUDA backend's compiled path on any device: on a CPU it runs
under `torch.compile` without graphs, which is how CI tests it against the readable engine.
``MEMWALL_ACCELERATE=compiled`` makes that the choice of every `accelerate(model)` left on
"auto", so that the whole book can run the GPU's code path on a CPU (slowly: it is a check).
"""

from __future__ import annotations

import os

from torch import nn

BACKENDS = ("auto", "cpu", "compiled")
ENVIRONMENT_VARIABLE = "MEMWALL_ACCELERATE"


def chosen_backend() -> str:
    """``MEMWALL_ACCELERATE`` if set (auto, cpu or compiled), else "auto"."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE, "").strip() or "auto"
    if chosen not in BACKENDS:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={chosen!r} is not a backend; use {', '.join(BACKENDS)}"
        )
    return chosen


def accelerate(module: nn.Module, backend: str = "auto") -> nn.Module:
    """`module` (a model, or one linear layer) with its device's speed path applied: the same
    weights, the same outputs up to rounding.

    backend: "auto" (``MEMWALL_ACCELERATE`` if set, else from the weights' device: cpu ->
    engine/cpu, cuda -> engine/cuda), "cpu", or "compiled" (engine/cuda's compiled decode on
    whatever device the weights are on)."""
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    tensor = next(iter((*module.parameters(), *module.buffers())), None)
    device = tensor.device.type if tensor is not None else "cpu"
    single_layer = not hasattr(module, "blocks")
    if backend == "auto" and not single_layer:
        backend = chosen_backend()
        if backend == "auto":
            if device not in ("cpu", "cuda"):
                raise ValueError(
                    f"accelerate has speed paths for weights on cpu or cuda, not {device}; "
                    "use the readable model there"
                )
            backend = "compiled" if device == "cuda" else "cpu"
    if backend == "compiled":
        from memwall.engine import cuda

        if single_layer:
            raise ValueError(
                f"the compiled path accelerates a whole model, not a {type(module).__name__}; "
                "single layers have twins on the cpu backend only"
            )
        return cuda.compiled(module)
    from memwall.engine.cpu import fast_decode, linears

    # One layer gets its CPU twin on any device (on a GPU its only path is PyTorch's); the CPU
    # backend on a model elsewhere hands every call to the readable code (`fallback_reason`).
    if type(module) in linears.TWINS:
        return linears.twin_of(module)
    return fast_decode.accelerate(module)


def speed_path() -> dict:
    """What `accelerate` can use on this machine's CPU: {"backend", "kernels" (the C variant in
    use, or None), "reason" (why there are none), "vnni" (int8 dot products in hardware)}. A model
    on a GPU takes the compiled path (`engine/cuda/`) instead."""
    from memwall.engine.cpu import kernels

    variant = kernels.variant() if kernels.available() else None
    return {
        "backend": "cpu",
        "kernels": variant,
        "reason": None if variant else kernels.unavailable_reason() or "switched off",
        "vnni": bool(variant) and kernels.has_vnni(),
    }
