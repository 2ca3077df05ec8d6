"""Checks made before grading starts, so a batch never runs only to give everyone 0.

Limits must be positive, pytest, nbval and ipykernel must be installed (the ``[grade]`` extra),
and the sandbox, when used, must be able to import what a graded notebook needs. Without
bubblewrap the grader says plainly that it runs unsandboxed.
"""

import os
import sys
import tempfile
from pathlib import Path

from memwall.grading.sandbox import Limits, bwrap_path, preflight

REQUIRED_MODULES = ("pytest", "nbval", "ipykernel")
UNSANDBOXED_WARNING = (
    "warning: bubblewrap (bwrap) is not available, so notebooks run UNSANDBOXED: student code "
    "can read and change anything this user can (install bubblewrap: `make grade` does it)"
)


def check_ready(timeout, cell_timeout, jobs, call_timeout=None):
    """Refuse nonsense limits and a Python without the grading tools, before grading anything."""
    import importlib.util

    for name, value in (("timeout", timeout), ("cell timeout", cell_timeout)):
        if not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"the {name} must be a positive number of seconds, got {value!r}")
    if call_timeout is not None and not (
        isinstance(call_timeout, (int, float)) and call_timeout > 0
    ):
        raise ValueError(
            f"the call timeout must be a positive number of seconds, got {call_timeout!r}"
        )
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a whole number >= 1, got {jobs!r}")
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"grading needs {', '.join(missing)}, which is not installed: "
            "pip install 'memwall[grade]'"
        )


def resolve_sandbox(sandbox, limits=Limits(), read_only_paths=()) -> bool:
    """Whether to sandbox; a sandbox that cannot import what notebooks need stops grading."""
    use = _wanted_sandbox(sandbox)
    if use:
        with tempfile.TemporaryDirectory(prefix="memwall-preflight-") as work_dir:
            problem = preflight(Path(work_dir), limits, read_only_paths)
        if problem:
            raise ValueError(f"a sandboxed Python cannot run the notebooks ({problem}); "
                             "fix that, or grade with --no-sandbox")  # fmt: skip
    return use


def _refuse_root_without_sandbox(why: str):
    """Student code never runs with root's rights: only the sandbox can drop them for it."""
    if os.geteuid() == 0:
        raise ValueError(
            f"{why} memwall grade runs as root: student code would run with root's rights. "
            "Grade as an ordinary user, or with the sandbox"
        )


def _wanted_sandbox(sandbox) -> bool:
    if sandbox not in ("auto", True, False):
        raise ValueError(f"sandbox must be 'auto', True or False, got {sandbox!r}")
    if sandbox is False:
        _refuse_root_without_sandbox("--no-sandbox")
        print("warning: --no-sandbox: notebooks run UNSANDBOXED", file=sys.stderr)
        return False
    if bwrap_path() is not None:
        return True
    _refuse_root_without_sandbox("bubblewrap (bwrap) is missing or cannot run here, and")
    if sandbox is True:
        raise ValueError(
            "the sandbox needs bubblewrap (bwrap), which is missing or cannot run here"
        )
    print(UNSANDBOXED_WARNING, file=sys.stderr)
    return False
