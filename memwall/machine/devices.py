"""The one device a notebook measures and runs on, so the roofline and the model never disagree.

`memwall.models.load`, `memwall.models.random_init` and `memwall.machine.measure` all default to
`default_device()`: the device named by ``MEMWALL_DEVICE`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``),
else an NVIDIA GPU where torch sees one (a reader who picked a GPU runtime expects the chapters
to run on it), else the CPU. ``MEMWALL_DEVICE=cpu`` keeps everything on the CPU of a GPU machine.
An Apple GPU (``mps``) is used only when named: memwall's speed paths are for CPUs and CUDA.
`describe()` says which device runs, in one plain sentence, and how to choose the other.
"""

from __future__ import annotations

import os

from memwall.machine.cpu_wait import waits_are_counted

ENVIRONMENT_VARIABLE = "MEMWALL_DEVICE"
KINDS = ("cpu", "cuda", "mps")


def default_device() -> str:
    """``MEMWALL_DEVICE`` if set (checked), else ``"cuda"`` where there is one, else ``"cpu"``."""
    chosen = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if not chosen:
        return "cuda" if _available("cuda") else "cpu"
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
    """One sentence saying which device the notebook measures, and what else is there; on a CPU
    that cannot count its threads' waits, a second saying what the verdicts cannot see."""
    device = device or default_device()
    text = _describe(device)
    if device.startswith("cpu") and not waits_are_counted():
        text += (
            "\nThis system does not count how long threads wait for a CPU: another busy"
            "\nprogram shows only in the timings' spread, and a verdict cannot name it."
        )
    return text


def _describe(device: str) -> str:
    named = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    if device.startswith("cpu"):
        if gpu_present():
            gpu = "cuda" if _available("cuda") else "mps"
            return (  # two short lines: chapters print it, and their output column is narrow
                "Runs on the CPU and measures the CPU.\n"
                f"This machine has a GPU too: set {ENVIRONMENT_VARIABLE}={gpu} before starting to use it."
            )
        return "Runs on the CPU and measures the CPU (no GPU found)."
    if named == device:
        return f"Runs on {device} and measures {device} ({ENVIRONMENT_VARIABLE}={device})."
    return (
        f"Runs on {device} and measures {device} (the GPU found).\n"
        f"To run on the CPU instead, set {ENVIRONMENT_VARIABLE}=cpu before starting."
    )


def _available(kind: str) -> bool:
    try:
        import torch
    except ImportError:
        return False
    backend = getattr(torch.backends, kind, None) if kind == "mps" else getattr(torch, kind, None)
    return bool(backend is not None and backend.is_available())
