"""The install path picks a torch build that exists on each platform, and the Binder lock pins it.

tools/ is memwall-free (it runs before memwall is installed), so it is loaded from its path.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch_pip_args = load_tool("torch_pip_args")
lock = load_tool("lock")
CPU_INDEX = torch_pip_args.DEFAULT_CPU_INDEX


CPU_BUILD = ["torch==2.13.0+cpu", "--extra-index-url", CPU_INDEX]


@pytest.mark.parametrize(
    "system, machine, has_nvidia, expected",
    [
        # Linux without an NVIDIA driver: the CPU build, never PyPI's CUDA wheels (x86_64 and,
        # since PyPI's aarch64 wheels became CUDA builds, aarch64 too).
        ("Linux", "x86_64", False, CPU_BUILD),
        ("Linux", "aarch64", False, CPU_BUILD),
        ("Linux", "arm64", False, CPU_BUILD),
        # With a driver, PyPI's CUDA build.
        ("Linux", "x86_64", True, ["torch==2.13.0"]),
        ("Linux", "aarch64", True, ["torch==2.13.0"]),
        # Apple Silicon: PyPI's wheel is the CPU/MPS build and has no +cpu twin.
        ("Darwin", "arm64", False, ["torch==2.13.0"]),
    ],
)
def test_torch_build_per_platform(system, machine, has_nvidia, expected):
    assert torch_pip_args.torch_pip_args(system, machine, has_nvidia, "2.13.0") == expected


@pytest.mark.parametrize(
    "system, machine, says",
    [
        ("Darwin", "x86_64", ["Intel macOS", "2.2.2", "Colab", "Binder"]),
        ("Windows", "AMD64", ["WSL 2", "make install", "Colab"]),
    ],
)
def test_platforms_without_a_usable_torch_are_refused_up_front(system, machine, says):
    with pytest.raises(torch_pip_args.UnsupportedPlatform) as refused:
        torch_pip_args.torch_pip_args(system, machine, False, "2.13.0")
    assert all(word in str(refused.value) for word in says), str(refused.value)


def run_tool(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "torch_pip_args.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_script_prints_one_argument_per_line():
    done = run_tool("--version", "2.13.0")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0].startswith("torch==2.13.0") and all(" " not in line for line in lines)


def test_the_script_describes_the_build_and_its_size():
    done = run_tool("--version", "2.13.0", "--describe")
    assert done.returncode == 0 and "torch 2.13.0" in done.stdout and " MB" in done.stdout
    assert len(done.stdout.splitlines()) == 1


def test_the_script_refuses_intel_macos_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch_pip_args.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(torch_pip_args.platform, "machine", lambda: "x86_64")
    assert torch_pip_args.main(["--version", "2.13.0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Intel macOS" in err


def test_the_lock_pins_cpu_torch_and_leaves_out_memwall_and_cuda():
    frozen = [
        "# Editable install with no version control (memwall==0.1.0)",
        "-e /work/main",
        "Jinja2==3.1.6",
        "torch==2.13.0",  # as frozen on macOS or a GPU machine
        "nvidia-cublas-cu12==12.8.4.1",
        "triton==3.5.0",
        "accelerate==1.15.0",
        "some-package @ file:///tmp/some_package-1.0-py3-none-any.whl",
    ]
    assert lock.lock_lines(frozen) == ["accelerate==1.15.0", "Jinja2==3.1.6", "torch==2.13.0+cpu"]


def test_binder_installs_the_locked_cpu_torch_and_builds_ahead():
    requirements = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert "-c constraints.txt" in requirements and "-r ../requirements.txt" in requirements
    constraints = (ROOT / "binder" / "constraints.txt").read_text().splitlines()
    torch_pins = [line for line in constraints if line.startswith("torch==")]
    assert len(torch_pins) == 1 and torch_pins[0].endswith("+cpu")
    assert not any(line.startswith(("memwall", "nvidia-")) for line in constraints)
    post_build = (ROOT / "binder" / "postBuild").read_text()
    assert "models.load('smollm2-135m')" in post_build and "memwall build-kernels" in post_build
    assert "-e .[engine,widgets]" in (ROOT / "requirements.txt").read_text().splitlines()


def test_rename_repo_rewrites_every_place_that_names_the_repository(tmp_path):
    rename_repo = load_tool("rename_repo")
    for name in rename_repo.FILES:
        if (ROOT / name).exists():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text((ROOT / name).read_text())
    old = rename_repo.current_url(tmp_path)
    changed = rename_repo.rename("https://github.com/someone/my-memwall.git", tmp_path)
    assert "_config.yml" in changed and "README.md" in changed
    assert rename_repo.current_url(tmp_path) == "https://github.com/someone/my-memwall"
    slug = old.split("github.com/")[1]
    for name in changed:
        assert slug not in (tmp_path / name).read_text(), name
    readme = (tmp_path / "README.md").read_text()
    assert "mybinder.org/v2/gh/someone/my-memwall/main" in readme
    assert "colab.research.google.com/github/someone/my-memwall/blob" in readme
    # The published site moves with the repository (GitHub Pages derives it from the owner).
    assert "https://someone.github.io/my-memwall/" in readme
    assert "https://someone.github.io/my-memwall/" in (tmp_path / "_config.yml").read_text()
    with pytest.raises(ValueError, match="OWNER/NAME"):
        rename_repo.rename("git@github.com:someone/x", tmp_path)
