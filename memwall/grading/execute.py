"""Run one notebook under ``pytest --nbval-lax`` in a fresh kernel, with hard time limits.

A student's notebook can loop forever, swallow KeyboardInterrupt, or kill its own kernel.
nbval handles a cell that runs past ``--nbval-cell-timeout`` by interrupting the kernel; when
that fails it stops the kernel and fails every later cell with "Kernel dead on test start",
which would zero exercises that had nothing to do with the fault. So ``run_notebook`` reruns
the notebook with the fatal cell replaced by a ``raise``, keeping the earlier run's results up
to that cell, until every cell has an honest result or the notebook's wall-clock budget is spent.

Each run gets a fresh scratch folder holding only the notebook, its private $HOME and /tmp;
with a ``Setup.sandbox`` it runs inside bubblewrap (sandbox.py), else directly with the same
cleared environment and limits. The whole process group is killed at the deadline (in the
sandbox that ends the PID namespace, and with it every process the student started). The
per-cell records (exercise_driver.recorder) come from inside the run, so they decide no points:
they only explain a zero, and are read defensively (safe_files.py).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from memwall.grading.bounds import mount_scratch_quota, unmount_scratch, warn_once
from memwall.grading.cells import code_cells
from memwall.grading.safe_files import UnsafeFile, read_regular
from memwall.grading.sandbox import (
    INSIDE_CHANNEL,
    INSIDE_SCRATCH,
    Limits,
    Sandbox,
    environment,
    hand_to_sandbox_user,
)

KERNEL_DEAD = "Kernel dead on test start"
CELL_TIMEOUT_PREFIX = "Timeout of"
SKIPPED_SOURCE = (
    'raise RuntimeError("memwall grader: cell skipped on the rerun, '
    'because in the first run it {reason}")'
)
LOG_TAIL_CHARACTERS = 2000
MAX_RECORDS_BYTES = 8 * 2**20
SOCKET_NAME = "grader.sock"
# Process groups of the pytest runs in flight, so an interrupted grader can end them all.
_RUNNING_GROUPS = set()
_RUNNING_LOCK = threading.Lock()


@dataclass
class CellOutcome:
    cell: int
    passed: bool
    ran: bool = True
    stdout: str = ""
    error: str = ""
    message: str = ""
    kernel_exit: int = None

    @property
    def timed_out(self) -> bool:
        return self.message.startswith(CELL_TIMEOUT_PREFIX)

    @property
    def kernel_was_dead(self) -> bool:
        return self.message == KERNEL_DEAD

    @property
    def killed_kernel(self) -> bool:
        return self.kernel_exit is not None


@dataclass
class NotebookRun:
    cells: dict = field(default_factory=dict)  # code cell index -> CellOutcome
    wall_timeout: bool = False
    runs: int = 0
    log_tail: str = ""
    returncode: int = None
    unreadable_records: str = ""  # why the per-cell records could not be read, if so


@dataclass
class Setup:
    """Where and how a notebook runs: a grader-private folder, and the sandbox (None: none)."""

    work_dir: Path
    sandbox: Sandbox = None
    threads: int = None
    call_limit: float = None  # the student's side stops one call after this many seconds
    limits: Limits = field(default_factory=Limits)

    @property
    def channel_dir(self) -> Path:
        return self.work_dir / "channel"

    @property
    def socket_path(self) -> Path:
        return self.channel_dir / SOCKET_NAME


def run_notebook(nb, cell_timeout, wall_timeout, threads=None, setup=None) -> NotebookRun:
    """Run ``nb``; return one CellOutcome per code cell that got a result."""
    deadline = time.monotonic() + wall_timeout
    result = NotebookRun()
    nb = nbformat.from_dict(nb)  # a private copy: fatal cells get replaced below
    first_unsettled = 0
    while True:
        once = run_notebook_once(nb, cell_timeout, deadline - time.monotonic(), threads, setup)
        result.runs += 1
        result.log_tail, result.returncode = once.log_tail, once.returncode
        result.unreadable_records = once.unreadable_records
        # Cells before first_unsettled already have their result from an earlier run.
        result.cells.update({i: o for i, o in once.cells.items() if i >= first_unsettled})
        if once.wall_timeout:
            result.wall_timeout = True
            return result
        fatal = fatal_cell(once.cells)
        if fatal is None or fatal < first_unsettled or time.monotonic() >= deadline:
            return result
        for index, outcome in once.cells.items():
            if index <= fatal and (outcome.timed_out or outcome.killed_kernel or index == fatal):
                reason = "stopped the kernel" if outcome.killed_kernel else "timed out"
                code_cells(nb)[index]["source"] = SKIPPED_SOURCE.format(reason=reason)
        first_unsettled = fatal + 1


def fatal_cell(cells: dict):
    """The cell after which the kernel was dead, if a later cell found it so."""
    dead = [index for index, outcome in cells.items() if outcome.kernel_was_dead]
    return min(dead) - 1 if dead else None


def run_notebook_once(nb, cell_timeout, wall_timeout, threads=None, setup=None) -> NotebookRun:
    result = NotebookRun(runs=1)
    if wall_timeout <= 0:
        result.wall_timeout = True
        return result
    if setup is None:  # a throwaway, unsandboxed run (the CI's blank-copy test uses this)
        with tempfile.TemporaryDirectory(prefix="memwall-run-") as work_dir:
            return run_notebook_once(
                nb, cell_timeout, wall_timeout, threads, Setup(Path(work_dir), threads=threads)
            )
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=setup.work_dir))
    # A tmpfs of fixed size and inode count where the grader is root: a notebook cannot fill
    # the host's disk or its inodes.
    quota = mount_scratch_quota(scratch, setup.limits.scratch_bytes, setup.limits.scratch_inodes)
    if not quota:
        warn_once(["the scratch folder's size and inodes (needs root)"])
    try:
        _run_in(scratch, nb, cell_timeout, wall_timeout, setup, result)
    finally:
        if quota:
            unmount_scratch(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def _run_in(scratch, nb, cell_timeout, wall_timeout, setup, result):
    sandboxed = setup.sandbox is not None
    inside = Path(INSIDE_SCRATCH) if sandboxed else scratch
    channel = Path(INSIDE_CHANNEL) / SOCKET_NAME if sandboxed else setup.socket_path
    for folder in ("home", "tmp"):
        (scratch / folder).mkdir()
    startup = scratch / "home" / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-memwall.py").write_text(
        "from memwall.exercise_driver.driver import harden\nharden()\n"
    )
    nbformat.write(nbformat.from_dict(nb), str(scratch / "submission.ipynb"))
    # An empty config file makes the scratch folder pytest's rootdir, away from any project's.
    (scratch / "pytest.ini").write_text("[pytest]\n")
    os.chmod(scratch, 0o755)
    hand_to_sandbox_user(scratch)  # when the grader is root, student code runs as nobody
    command = [
        sys.executable, "-m", "pytest", str(inside / "submission.ipynb"),
        "-p", "nbval.plugin", "-p", "memwall.exercise_driver.recorder", "-p", "no:cacheprovider",
        "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}",
        f"--memwall-results={inside / 'results.jsonl'}", "-q", "--tb=no", "-o", "addopts=",
    ]  # fmt: skip
    limits = None  # an unsandboxed run's own cgroup, removed afterwards
    if sandboxed:
        command = setup.sandbox.command(command, scratch, setup.channel_dir)
    else:
        limits = Sandbox(setup.work_dir, setup.limits, cpus=setup.threads)
        command = limits.unsandboxed(command)
    env = environment(
        setup.threads, inside / "home", inside / "tmp" if not sandboxed else "/tmp", channel,
        setup.call_limit,
    )  # fmt: skip
    log_path = setup.work_dir / f"pytest-{scratch.name}.log"
    try:
        with open(log_path, "wb") as log:
            result.returncode = _wait(command, scratch, log, env, wall_timeout, result)
    finally:
        if limits is not None:
            limits.close()
    records, result.unreadable_records = read_records(scratch / "results.jsonl")
    if not sandboxed:
        # Unsandboxed, the kernel runs in its own session: kill it too, and what it started.
        for record in records:
            if "kernel_pid" in record:
                kill_group(record["kernel_pid"])
    for record in records:
        outcome = cell_outcome(record)
        if outcome is not None:
            result.cells[outcome.cell] = outcome
    try:
        tail = read_regular(log_path, LOG_TAIL_CHARACTERS * 4, tail=True)
    except OSError:
        tail = b""
    result.log_tail = tail.decode("utf-8", errors="replace")[-LOG_TAIL_CHARACTERS:]


def _wait(command, scratch, log, env, wall_timeout, result):
    process = subprocess.Popen(
        command, cwd=scratch, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=env, start_new_session=True,
    )  # fmt: skip
    with _RUNNING_LOCK:
        _RUNNING_GROUPS.add(process.pid)
    try:
        return process.wait(timeout=wall_timeout)
    except subprocess.TimeoutExpired:
        result.wall_timeout = True
        kill_group(process.pid)
        return process.wait()
    finally:
        with _RUNNING_LOCK:
            _RUNNING_GROUPS.discard(process.pid)


def cell_outcome(record):
    """A CellOutcome from one record, or None when the record is malformed."""
    fields = CellOutcome.__dataclass_fields__
    if not isinstance(record, dict) or not isinstance(record.get("cell"), int):
        return None
    values = {name: record[name] for name in fields if name in record}
    for name in ("stdout", "error", "message"):
        values[name] = str(values.get(name, ""))[-20_000:]
    values["passed"], values["ran"] = bool(values.get("passed")), bool(values.get("ran", True))
    exit_code = values.get("kernel_exit")
    values["kernel_exit"] = exit_code if isinstance(exit_code, int) else None
    return CellOutcome(**values)


def read_records(path: Path) -> tuple:
    """(the JSON records in ``path``, "" or why they could not be read)."""
    try:
        data = read_regular(path, MAX_RECORDS_BYTES)
    except FileNotFoundError:
        return [], ""
    except (UnsafeFile, OSError) as error:
        return [], str(error)
    records = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except (ValueError, RecursionError):
            continue  # a line cut short by a kill
    return records, ""


def kill_running_notebooks():
    """Kill every pytest run in flight (their kernels notice their parent died and exit)."""
    with _RUNNING_LOCK:
        groups = list(_RUNNING_GROUPS)
    for pid in groups:
        kill_group(pid)


def kill_group(pid):
    # A pid from a record is the student's word: never our own group, never init.
    if not isinstance(pid, int) or pid <= 1 or pid == os.getpgid(0):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
