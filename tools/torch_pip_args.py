"""Which torch build `make install` asks pip for, on this platform. Standard library only.

- Linux (x86_64 or aarch64) without an NVIDIA driver: the CPU build `torch==X+cpu` from PyTorch's
  CPU index. PyPI's Linux wheels for both are CUDA builds that pull several GB of CUDA libraries.
- Linux with an NVIDIA driver: PyPI's regular (CUDA) build.
- macOS on Apple Silicon: PyPI's build (CPU and MPS; there is no `+cpu` twin).
- macOS on Intel: refused. PyPI's last torch for it is 2.2.2, older than memwall's floor (2.5).
- Windows: refused; the Makefile needs a Unix shell, and WSL 2 is Linux (follow the Linux path).

    python tools/torch_pip_args.py --version 2.13.0    # the pip arguments, one per line
    python tools/torch_pip_args.py --version 2.13.0 --describe    # one line: what and how big

An unsupported platform exits with status 2 and a one-line message naming what to do instead.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys

DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
X86_64 = ("x86_64", "amd64")
ARM64 = ("aarch64", "arm64")
ELSEWHERE = (
    "run the chapters on Colab or Binder instead (the launch buttons on every page), "
    "or read the published site"
)


class UnsupportedPlatform(ValueError):
    """No torch build that memwall can use exists for this platform."""


def torch_pip_args(
    system: str, machine: str, has_nvidia: bool, version: str, cpu_index: str = DEFAULT_CPU_INDEX
) -> list[str]:
    """pip arguments for torch `version` on (platform.system(), platform.machine(), a GPU?)."""
    system, machine = system.lower(), machine.lower()
    if system == "darwin" and machine in X86_64:
        raise UnsupportedPlatform(
            "Intel macOS is not supported: PyPI's last torch for it is 2.2.2 and memwall needs "
            f"torch>=2.5; {ELSEWHERE}"
        )
    if system == "windows":
        raise UnsupportedPlatform(
            "Windows: install WSL 2 (`wsl --install`, Ubuntu) and run `make install` inside it, "
            f"which follows the Linux path; or {ELSEWHERE}"
        )
    if system == "linux" and machine in X86_64 + ARM64 and not has_nvidia:
        # The exact `+cpu` version cannot be met by a CUDA wheel: an unreachable index fails
        # loudly instead of quietly installing several GB of CUDA libraries.
        return [f"torch=={version}+cpu", "--extra-index-url", cpu_index]
    return [f"torch=={version}"]


# Rough download sizes (one wheel, Python 3.11, torch 2.13), for the line printed before the
# step: the CPU build, and the CUDA build with the NVIDIA libraries it pulls.
DOWNLOAD_SIZE = {"cpu": "about 200 MB", "cuda": "about 3 GB with its CUDA libraries"}


def describe(system: str, machine: str, has_nvidia: bool, version: str) -> str:
    """One line for the installer's log: which build, from where, roughly how big."""
    args = torch_pip_args(system, machine, has_nvidia, version)
    if args[0].endswith("+cpu"):
        return f"torch {version}, CPU build from PyTorch's CPU index ({DOWNLOAD_SIZE['cpu']})"
    if system.lower() == "linux":
        return f"torch {version}, CUDA build from PyPI ({DOWNLOAD_SIZE['cuda']})"
    return f"torch {version} from PyPI ({DOWNLOAD_SIZE['cpu']})"


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is installed (its nvidia-smi is on PATH)."""
    return shutil.which("nvidia-smi") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="torch release, e.g. 2.13.0")
    parser.add_argument("--cpu-index", default=DEFAULT_CPU_INDEX, help="PyTorch's CPU index")
    parser.add_argument("--describe", action="store_true", help="print one line for the log")
    args = parser.parse_args(argv)
    here = (platform.system(), platform.machine(), has_nvidia_gpu(), args.version)
    try:
        if args.describe:
            print(describe(*here))
        else:
            print("\n".join(torch_pip_args(*here, args.cpu_index)))
    except UnsupportedPlatform as error:
        print(f"memwall install: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
