"""A tiny pytest plugin that records how each nbval cell ended, for the grader's status column.

The grader runs ``pytest --nbval-lax -p memwall.exercise_driver.recorder --memwall-results FILE``.
nbval makes one test item per code cell ("Cell 0", "Cell 1", ...). For each one this plugin
appends a JSON line to FILE as soon as the cell finishes, so the results survive even when the
grader has to kill pytest for running past the notebook's time limit. It also records the
kernel's pid (so the grader can kill a kernel stuck in C code) and notices when the kernel
process dies during a cell (``os._exit``), which nbval itself reports only as a timeout.

These records run next to the student's code and decide no points: the grader scores each check
through its own channel (memwall.grading.channel). They only explain a zero ("timed out", "the
kernel died"), and the grader reads them defensively.
"""

import json
import threading
import time

import pytest

from memwall.exercise_driver.driver import harden

KERNEL_POLL_SECONDS = 0.1
# A student's function may print without end; the check's own line comes last, so keep the tail.
STDOUT_KEPT_CHARACTERS = 20_000


def pytest_addoption(parser):
    parser.addoption("--memwall-results", default=None, help="JSON-lines file for per-cell results")


def pytest_configure(config):
    harden()  # before nbval starts the kernel: the student's code cannot attach to pytest
    _stop_waiting_for_a_dead_kernel()


def _stop_waiting_for_a_dead_kernel():
    """Make nbval's wait for a cell's reply end soon after the kernel process dies.

    nbval waits for the reply on the shell channel for the whole cell timeout (minutes), and a
    kernel ended by ``os._exit`` never replies. Waiting in short slices and checking the process
    between them ends the cell at once; nbval then reports it as it reports a timeout (and this
    plugin records the exit), so nothing else changes.
    """
    from queue import Empty

    from nbval.kernel import RunningKernel

    wait = RunningKernel.get_message
    if getattr(wait, "_memwall_sliced", False):
        return

    def get_message(self, stream, timeout=None):
        if stream != "shell" or timeout is None:
            return wait(self, stream, timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                return wait(self, stream, timeout=max(0.0, min(KERNEL_POLL_SECONDS, remaining)))
            except Empty:
                if remaining <= KERNEL_POLL_SECONDS or not self.is_alive():
                    raise

    get_message._memwall_sliced = True
    RunningKernel.get_message = get_message


def _write(config, record):
    path = config.getoption("memwall_results")
    if path:
        with open(path, "a", encoding="utf-8") as results:
            results.write(json.dumps(record) + "\n")


def _kernel_process(item):
    kernel = getattr(getattr(item, "parent", None), "kernel", None)
    provisioner = getattr(getattr(kernel, "km", None), "provisioner", None)
    return getattr(provisioner, "process", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield
    process = _kernel_process(item)
    if process is not None and not getattr(item.config, "_memwall_pid_written", False):
        item.config._memwall_pid_written = True
        _write(item.config, {"kernel_pid": process.pid})


class _KernelWatch(threading.Thread):
    """Polls the kernel process during one cell and remembers whether the cell's code ended it.

    nbval stops the kernel itself, but only after the cell timeout has passed and an interrupt
    failed; an exit before the timeout was the student's code (``os._exit``) or a crash.
    """

    def __init__(self, process, cell_timeout):
        super().__init__(daemon=True)
        self.process, self.exit_code = process, None
        self.deadline = time.monotonic() + cell_timeout
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(KERNEL_POLL_SECONDS) and time.monotonic() < self.deadline:
            code = self.process.poll()
            if code is not None:
                self.exit_code = code
                return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    process = _kernel_process(item)
    alive = process is not None and process.poll() is None
    watch = _KernelWatch(process, float(item.config.option.nbval_cell_timeout)) if alive else None
    if watch:
        watch.start()
    yield
    if watch:
        watch.done.set()
        watch.join()
        item._memwall_kernel_exit = watch.exit_code


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # One record per cell: its "call", or its "setup" when that failed (the kernel did not start).
    if (
        not hasattr(item, "cell_num")
        or call.when == "teardown"
        or (call.when == "setup" and report.passed)
    ):
        return
    outputs = getattr(item, "test_outputs", None) or []
    stdout = "".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")
    errors = [
        f"{out.get('ename')}: {out.get('evalue')}"
        for out in outputs
        if out.get("output_type") == "error"
    ]
    message = str(call.excinfo.value) if call.excinfo is not None else ""
    # nbval marks every cell after a timeout as xfail; one that still passes is a real pass.
    not_run = report.skipped and not hasattr(report, "wasxfail")
    _write(
        item.config,
        {
            "cell": item.cell_num,
            "passed": report.passed,
            "ran": not not_run,
            "stdout": stdout[-STDOUT_KEPT_CHARACTERS:],
            "error": errors[0] if errors else message,
            "message": message,
            "kernel_exit": getattr(item, "_memwall_kernel_exit", None),
        },
    )
