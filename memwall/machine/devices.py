"""The one device a notebook measures and runs on, so the roofline and the model never disagree.

`memwall.models.load`, `memwall.models.random_init` and `memwall.machine.measure` all default to
`default_device()`: the device named by ``MEMWALL_DEVICE`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``),
else the CPU. The CPU is the default even when a GPU is present (as on a Colab GPU runtime)
because the chapters are written for it; `describe()` says so in one plain sentence, and
``MEMWALL_DEVICE=cuda`` moves the model, the engine and the measurements to the GPU together.
The `memwall` command's own `--device` options keep preferring a GPU when there is one.
"""

from __future__ import annotations

import os

ENVIRONMENT_VARIABLE = "MEMWALL_DEVICE"
KINDS = ("cpu", "cuda", "mps")


def default_device() -> str:
    """``MEMWALL_DEVICE`` if set (checked), else ``"cpu"``."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not chosen:
        return "cpu"
    kind, _, index = chosen.partition(":")
    if kind not in KINDS or (index and not index.isdigit()):
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={chosen!r} is not a device; use cpu, cuda, cuda:N or mps."
        )
    if kind != "cpu" and not _available(kind):
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={chosen!r}, but this torch sees no {kind} device."
        )
    return chosen


def gpu_present() -> bool:
    return _available("cuda") or _available("mps")


def describe(device: str | None = None) -> str:
    """One sentence saying which device the notebook measures, and what else is there."""
    device = device or default_device()
    if device.startswith("cpu"):
        if gpu_present():
            return (  # two short lines: chapters print it, and their output column is narrow
                "Runs on the CPU and measures the CPU.\n"
                f"This machine has a GPU too: set {ENVIRONMENT_VARIABLE}=cuda before starting to use it."
            )
        return "Runs on the CPU and measures the CPU (no GPU found)."
    return f"Runs on {device} and measures {device} ({ENVIRONMENT_VARIABLE}={device})."


def _available(kind: str) -> bool:
    try:
        import torch
    except ImportError:
        return False
    backend = getattr(torch.backends, kind, None) if kind == "mps" else getattr(torch, kind, None)
    return bool(backend is not None and backend.is_available())
