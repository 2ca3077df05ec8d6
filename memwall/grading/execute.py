"""Run one notebook under ``pytest --nbval-lax`` in a fresh kernel, with hard time limits.

A student's notebook can loop forever, swallow KeyboardInterrupt, or kill its own kernel.
nbval handles a cell that runs past ``--nbval-cell-timeout`` by interrupting the kernel; when
that fails it stops the kernel and fails every later cell with "Kernel dead on test start",
which would zero exercises that had nothing to do with the fault. So ``run_notebook`` reruns
the notebook with the fatal cell replaced by a ``raise``, keeping the earlier run's results up
to that cell, until every cell has an honest result or the notebook's wall-clock budget is spent.
The whole pytest process group, and the kernel's own process group, are killed at the deadline.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from memwall.grading.cells import code_cells
from memwall.grading.signing import verify

KERNEL_DEAD = "Kernel dead on test start"
CELL_TIMEOUT_PREFIX = "Timeout of"
SKIPPED_SOURCE = (
    'raise RuntimeError("memwall grader: cell skipped on the rerun, '
    'because in the first run it {reason}")'
)
LOG_TAIL_CHARACTERS = 2000
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
    forged_records: int = 0  # results with a bad signature: student code wrote them


def run_notebook(nb, cell_timeout, wall_timeout, threads=None) -> NotebookRun:
    """Run ``nb``; return one CellOutcome per code cell that got a result."""
    deadline = time.monotonic() + wall_timeout
    result = NotebookRun()
    nb = nbformat.from_dict(nb)  # a private copy: fatal cells get replaced below
    first_unsettled = 0
    while True:
        once = run_notebook_once(nb, cell_timeout, deadline - time.monotonic(), threads)
        result.runs += 1
        result.log_tail, result.returncode = once.log_tail, once.returncode
        result.forged_records += once.forged_records
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


def run_notebook_once(nb, cell_timeout, wall_timeout, threads=None) -> NotebookRun:
    result = NotebookRun(runs=1)
    if wall_timeout <= 0:
        result.wall_timeout = True
        return result
    with tempfile.TemporaryDirectory(prefix="memwall-run-") as workdir:
        workdir = Path(workdir)
        notebook_path = workdir / "submission.ipynb"
        results_path = workdir / "results.jsonl"
        log_path = workdir / "pytest.log"
        key_path = workdir / "key"
        key = secrets.token_hex(32).encode()
        key_path.write_bytes(key)
        key_path.chmod(0o600)
        nbformat.write(nbformat.from_dict(nb), str(notebook_path))
        # An empty config file makes workdir the rootdir, away from any project's pytest settings.
        (workdir / "pytest.ini").write_text("[pytest]\n")
        command = [
            sys.executable, "-m", "pytest", str(notebook_path),
            "-p", "nbval.plugin", "-p", "memwall.grading.nbval_plugin", "-p", "no:cacheprovider",
            "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={cell_timeout}",
            f"--memwall-results={results_path}", f"--memwall-key-file={key_path}",
            "-q", "--tb=no", "-o", "addopts=",
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=child_environment(threads), start_new_session=True,
            )  # fmt: skip
            with _RUNNING_LOCK:
                _RUNNING_GROUPS.add(process.pid)
            try:
                result.returncode = process.wait(timeout=wall_timeout)
            except subprocess.TimeoutExpired:
                result.wall_timeout = True
                kill_group(process.pid)
                result.returncode = process.wait()
            finally:
                with _RUNNING_LOCK:
                    _RUNNING_GROUPS.discard(process.pid)
        signed = read_records(results_path)
        records = [record for record in (verify(key, raw) for raw in signed) if record is not None]
        result.forged_records = len(signed) - len(records)
        # The kernel runs in its own session; kill that too, with anything the student started.
        for record in records:
            if "kernel_pid" in record:
                kill_group(record["kernel_pid"])
        for record in records:
            if "cell" in record:
                fields = {
                    name: record[name]
                    for name in CellOutcome.__dataclass_fields__
                    if name in record
                }
                result.cells[record["cell"]] = CellOutcome(**fields)
        result.log_tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARACTERS:]
    return result


def child_environment(threads):
    env = dict(os.environ)
    # Only our two plugins: others installed in the environment could change how cells run.
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    if threads:
        # Parallel notebooks must share the cores, not each grab all of them.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(name, str(threads))
    return env


def read_records(path: Path) -> list:
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
    return records


def kill_running_notebooks():
    """Kill every pytest run in flight (their kernels notice their parent died and exit)."""
    with _RUNNING_LOCK:
        groups = list(_RUNNING_GROUPS)
    for pid in groups:
        kill_group(pid)


def kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
