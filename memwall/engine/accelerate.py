"""`accelerate(model)`: the one door from the readable engine to a machine's speed path.

The readable engine (`model`, `layers`, `linear`, `quant`, ...) is the textbook: plain PyTorch,
the reference every speed path is tested against. Each kind of device has its speed path in a
backend beside it, as gpt-fast and nano-vllm keep theirs: `engine/cpu/` (C kernels chosen by
measurement, a decode step fused in C) and `engine/cuda/` (a static KV cache and compiled decode
steps replayed as CUDA graphs). `accelerate` picks the backend from the device the model's weights
live on and returns a new model that shares those weights; the model passed in is left as it was.
"""

from __future__ import annotations

from torch import nn


def accelerate(model: nn.Module) -> nn.Module:
    """`model` with its device's speed path applied: same weights, same outputs within rounding."""
    from memwall.engine.cpu.fast_decode import accelerate as accelerate_cpu

    # Until engine/cuda/ exists, the CPU backend also wraps models on other devices: its twins and
    # its fused step then hand every call to the readable code (`fallback_reason` says so).
    return accelerate_cpu(model)
