"""Every command CONTRIBUTING.md tells a contributor to type works on a fresh clone.

The commands are read from the file itself (inline code and ```bash blocks that start with a
program), so a new one is checked the day it is written. The quick ones run for real; the long
ones (a book build, the full test run, executing a chapter) are checked as far as is quick: the
make target exists and `make -n` accepts it, the program and its subcommand exist, the files named
are there. A command no rule knows fails the test, so none slips through unchecked.
"""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memwall import cli

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent  # `.venv/bin/` in CONTRIBUTING: the environment running us
PROGRAMS = ("make ", ".venv/bin/", "memwall ", "time ")
EXAMPLE_CHAPTER = "01_two_phases"  # stands for NN_slug


def commands() -> list[str]:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    found = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    prose = re.sub(r"````.*?````|```.*?```", "", text, flags=re.S)  # fences are not inline code
    found += re.findall(r"(?<!`)`([^`]+)`(?!`)", prose)
    found = [" ".join(command.split()) for command in found]
    return sorted({c for c in found if c.startswith(PROGRAMS)})


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def run(argv: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_contributing_names_the_commands_a_pull_request_runs():
    found = commands()
    for command in ("make lint", ".venv/bin/memwall notebooks --check", "make test-fast"):
        assert command in found
    assert not any("nbconvert" in c for c in found)  # not installed: jupyter execute is


@pytest.mark.parametrize("command", commands())
def test_each_command_runs(command, tmp_path):
    words = shlex.split(command.removeprefix("time "))
    program, args = words[0], words[1:]
    if program == "make":
        # Dry run only: a real `make test` takes many minutes (CI runs it anyway).
        assert shutil.which("make"), "make is not installed"
        assert args[0] in make_targets(), f"no `{args[0]}` target in the Makefile"
        done = run(["make", "-n", *args])
        assert done.returncode == 0, done.stderr
        return
    if program.startswith(".venv/bin/") or program == "memwall":  # memwall: the venv activated
        program = str(VENV_BIN / program.removeprefix(".venv/bin/"))
        assert Path(program).exists(), f"{command}: {program} is not installed by make install"
    name = Path(program).name
    if name == "memwall":
        assert args[0] in cli.COMMANDS, command
        if args == ["notebooks", "--check"]:  # quick, changes nothing: run it
            done = run([program, *args], timeout=300)
            assert done.returncode == 0, done.stdout + done.stderr
        else:  # the real ones measure or write files; their options must parse
            assert run([program, args[0], "--help"]).returncode == 0, command
        return
    if name == "ruff":  # FILE: a file of the contributor's; here a copy of one of ours
        sample = tmp_path / "sample.py"
        sample.write_text((ROOT / "memwall" / "units.py").read_text())
        done = run([program, *[str(sample) if a == "FILE" else a for a in args]])
        assert done.returncode == 0, done.stdout + done.stderr
        return
    if name == "jupyter":  # executing a chapter takes minutes: the runner and the notebook exist
        assert run([program, args[0], "--help"]).returncode == 0, f"no `jupyter {args[0]}`"
        notebook = ROOT / args[-1].replace("NN_slug", EXAMPLE_CHAPTER)
        assert notebook.exists(), notebook
        return
    if name == "python" and args[:2] == ["-m", "pytest"]:  # slow tests: they must be collectable
        files = [a for a in args if a.endswith(".py")]
        assert files and all((ROOT / f).exists() for f in files), command
        done = run([program, "-m", "pytest", "--collect-only", "-q", *args[2:]], timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr
        return
    if name == "python" and args and args[0].endswith(".py"):  # a script: it must start
        assert (ROOT / args[0]).exists(), command
        done = run([program, args[0]])  # without its flag it prints its usage and builds nothing
        assert all(flag in done.stdout + done.stderr for flag in args[1:]), done.stderr
        return
    pytest.fail(f"no rule checks {command!r}: add one here")
