"""Which torch build `make install` asks pip for, on this platform. Standard library only.

PyTorch publishes a separate CPU-only build (`torch==X+cpu`, on its own package index) only for
Linux and Windows on x86_64; there the default PyPI wheel bundles several GB of CUDA libraries.
macOS wheels (Apple Silicon and Intel) and Linux aarch64 wheels on PyPI are already CPU builds
(with MPS on Apple Silicon) and have no `+cpu` twin, so asking for one there fails. With an NVIDIA
GPU the regular PyPI build is the one wanted.

    python tools/torch_pip_args.py --version 2.13.0    # prints the pip arguments, one per line
"""

from __future__ import annotations

import argparse
import platform
import shutil

DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
X86_64 = ("x86_64", "amd64")


def torch_pip_args(
    system: str, machine: str, has_nvidia: bool, version: str, cpu_index: str = DEFAULT_CPU_INDEX
) -> list[str]:
    """pip arguments for torch `version` on (platform.system(), platform.machine(), a GPU?)."""
    system, machine = system.lower(), machine.lower()
    if system == "linux" and machine in X86_64 and not has_nvidia:
        # The exact `+cpu` version cannot be met by a CUDA wheel: an unreachable index fails
        # loudly instead of quietly installing several GB of CUDA libraries.
        return [f"torch=={version}+cpu", "--extra-index-url", cpu_index]
    return [f"torch=={version}"]


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is installed (its nvidia-smi is on PATH)."""
    return shutil.which("nvidia-smi") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="torch release, e.g. 2.13.0")
    parser.add_argument("--cpu-index", default=DEFAULT_CPU_INDEX, help="PyTorch's CPU index")
    args = parser.parse_args(argv)
    for arg in torch_pip_args(
        platform.system(), platform.machine(), has_nvidia_gpu(), args.version, args.cpu_index
    ):
        print(arg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
