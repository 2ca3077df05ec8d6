"""The core installs lean: `memwall calc` and `memwall --help` need neither torch nor numpy.

The extras in pyproject.toml are what the CLI names when a command's extra is missing, and the
version floors there are the ones memwall checks at import.
"""

import json
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest
import test_cli  # tests/ is on sys.path under pytest

from memwall import _versions, cli

ROOT = Path(__file__).resolve().parents[1]
CALC = [*test_cli.CALC, "--json"]  # llama-3-8b on an H100, 16 x 8192 tokens
HEAVY = ("torch", "numpy", "transformers", "matplotlib", "ipywidgets", "nbformat", "jupytext")

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the checks below only read the file


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement_name(line: str) -> str:
    name = line
    for stop in "<>=!~[; ":
        name = name.split(stop)[0]
    return name.strip().lower().replace("_", "-")


def test_the_core_has_no_dependencies_and_every_extra_exists():
    project = pyproject()["project"]
    assert project["dependencies"] == []
    extras = project["optional-dependencies"]
    assert {"engine", "widgets", "grade", "book", "dev"} <= set(extras)
    assert "memwall[engine,widgets,grade,book]" in extras["dev"]
    assert project["license"] == "MIT" and "LICENSE" in project["license-files"]
    for path in ("LICENSE", "LICENSE-BOOK", "CITATION.cff"):
        assert (ROOT / path).is_file(), path


def test_the_cli_names_extras_that_declare_its_modules():
    extras = pyproject()["project"]["optional-dependencies"]
    for extra, modules in cli.EXTRA_MODULES.items():
        declared = {requirement_name(line) for line in extras[extra]}
        for module in modules:
            assert module in declared, f"{module} is not in the {extra} extra"
    for command in cli.COMMANDS.values():
        assert command.extra is None or command.extra in extras


def test_the_declared_floors_are_the_checked_ones():
    engine = pyproject()["project"]["optional-dependencies"]["engine"]
    for package, minimum in _versions.MINIMUM.items():
        assert f"{package}>={minimum}" in engine


def test_an_old_release_fails_at_import_with_the_upgrade(monkeypatch):
    monkeypatch.setattr(_versions.importlib.metadata, "version", lambda name: "2.4.1+cpu")
    with pytest.raises(ImportError, match=r'pip install -U "torch>=2.5"'):
        _versions.require("torch")
    monkeypatch.setattr(_versions.importlib.metadata, "version", lambda name: "2.5.0")
    _versions.require("torch")
    assert _versions.release("4.57.0.dev0") == (4, 57, 0) > _versions.release("4.56")


# A Python started with these lines first cannot import the heavy packages: a lean install.
BLOCK_HEAVY = textwrap.dedent(f"""
    import sys
    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, Blocked())
    import importlib.util
    _find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: (
        None if name.split(".")[0] in {HEAVY!r} else _find_spec(name, *a))
""")


def run_lean(*argv: str) -> subprocess.CompletedProcess:
    code = BLOCK_HEAVY + textwrap.dedent(f"""
        from memwall.cli import main
        status = main({list(argv)!r})
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        sys.stdout.flush()
        print("HEAVY", heavy, file=sys.stderr)
        sys.exit(status)
    """)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_calc_help_and_version_run_without_torch_or_numpy():
    done = run_lean(*CALC)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_users"] == 59
    assert "HEAVY []" in done.stderr
    done = run_lean("--help")
    assert done.returncode == 0 and "HEAVY []" in done.stderr
    for command in cli.COMMANDS:
        assert command in done.stdout
    assert "[memwall[engine], not installed]" in done.stdout
    assert run_lean("--version").returncode == 0


@pytest.mark.parametrize("argv", [["bench", "decode"], ["info"], ["generate", "hi"], ["serve"]])
def test_a_command_without_its_extra_is_one_line_and_exit_2(argv):
    done = run_lean(*argv)
    message = done.stderr.replace("HEAVY []", "").strip()
    assert done.returncode == 2 and done.stdout == ""
    assert message.endswith('pip install "memwall[engine]"') and "\n" not in message


@pytest.mark.slow
def test_pip_install_without_extras_in_a_fresh_venv(tmp_path):
    """`pip install .` with no extras, offline: a wheel built here, installed with --no-index."""
    pytest.importorskip("setuptools")
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    source.mkdir()  # a copy, so that setuptools' build/ folder is not left in the repository
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "memwall", source / "memwall", ignore=shutil.ignore_patterns("__pycache__")
    )
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("memwall-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    sources = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "memwall").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so")
    }
    assert not sources - shipped, "package-data misses these files"
    # The answer key stays with the instructor (issue 37): no reference in what students install,
    # only the data their check cells and widgets read.
    with zipfile.ZipFile(wheel) as archive:
        texts = {name: archive.read(name) for name in shipped if name.endswith(".py")}
    assert not [name for name, text in texts.items() if b"\ndef reference_" in text]
    assert not [name for name in shipped if "grading/checks/" in name]
    assert {
        "memwall/grading/expected/ch01.json",
        "memwall/widgets/curves/01_two_phases.json",
    } <= shipped
    env_dir = tmp_path / "lean"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    install = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-index"] + [str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    memwall = str(bin_dir / "memwall")
    calc = subprocess.run([memwall, *CALC], capture_output=True, text=True, timeout=60)
    assert calc.returncode == 0, calc.stderr
    assert json.loads(calc.stdout)["max_users"] == 59
    helped = subprocess.run([memwall, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "generate" in helped.stdout, helped.stderr
    bench = subprocess.run([memwall, "bench"], capture_output=True, text=True, timeout=60)
    assert bench.returncode == 2 and 'pip install "memwall[engine]"' in bench.stderr
    packages = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    names = {p["name"].lower() for p in json.loads(packages.stdout)}
    assert not names & {"torch", "numpy", "transformers"}
