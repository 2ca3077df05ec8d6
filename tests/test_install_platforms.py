"""The torch that `make install` pins resolves on every platform the README supports.

For each platform, `pip install --dry-run --platform ... --only-binary=:all:` asks the real package
indexes for the exact build tools/torch_pip_args.py picks there (only torch, --no-deps), without
installing it. Intel macOS must not resolve: that is why the installer refuses it. Slow: it needs
the network, and pip downloads each wheel it checks (about 0.3 GB in all) to read its metadata.
A platform whose index cannot be reached is skipped with the reason, never passed.
"""

import importlib.util
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "torch_pip_args", ROOT / "tools" / "torch_pip_args.py"
)
torch_pip_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_pip_args)

TORCH_VERSION = re.search(r"^TORCH_VERSION\s*\?=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PYPI = "https://pypi.org/simple"


def reachable(index: str) -> bool:
    """The index answers for torch (pip itself hides a failed index: it just finds nothing)."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=15):
            return True
    except (OSError, ValueError):
        return False


def dry_run(platform_tag: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-cache-dir",
            "--only-binary=:all:", "--platform", platform_tag, "--python-version", PYTHON,
            "--target", str(tmp_path / "target"), "--timeout", "20", "--retries", "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "system, machine, platform_tag",
    [
        ("Linux", "x86_64", "manylinux_2_28_x86_64"),
        ("Linux", "aarch64", "manylinux_2_28_aarch64"),
        ("Darwin", "arm64", "macosx_14_0_arm64"),
    ],
)
def test_the_pinned_torch_resolves(system, machine, platform_tag, tmp_path):
    args = torch_pip_args.torch_pip_args(system, machine, False, TORCH_VERSION)
    done = dry_run(platform_tag, args, tmp_path)
    output = done.stdout + done.stderr
    index = args[args.index("--extra-index-url") + 1] if "--extra-index-url" in args else PYPI
    if done.returncode != 0 and not reachable(index):
        pytest.skip(f"{index} unreachable from here, so {args[0]} on {platform_tag} is unchecked")
    assert done.returncode == 0, output[-2000:]
    assert f"Would install torch-{args[0].split('==')[1]}" in output, output[-2000:]


@pytest.mark.slow
def test_intel_macos_has_no_such_torch(tmp_path):
    done = dry_run("macosx_10_15_x86_64", [f"torch=={TORCH_VERSION}"], tmp_path)
    output = done.stdout + done.stderr
    if not reachable(PYPI):
        pytest.skip("PyPI unreachable from here: Intel macOS's answer is unchecked")
    assert done.returncode != 0 and "Would install" not in output, output[-2000:]
