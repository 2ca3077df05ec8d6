"""Points and messages for one graded notebook.

A check's points come only from the grader's own verdict (channel.py). When a check has no
verdict (its cell never reached the grader) the run's per-cell records, which come from inside
the student's run, only explain why it scored zero.
"""

import re
from dataclasses import dataclass

from memwall.grading.cells import check_cells

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MAX_MESSAGE = 2000


@dataclass
class CheckResult:
    name: str
    points: float
    earned: float
    message: str  # the pass line, or why it failed


def score_checks(nb, run, verdicts, timeout) -> list:
    results = []
    for index, name, points in check_cells(nb):
        verdict = verdicts.get(name)
        outcome = run.cells.get(index)
        if verdict is not None:
            earned = points if verdict.passed else 0
            results.append(CheckResult(name, points, earned, clip(verdict.message)))
        elif outcome is None or not outcome.ran:
            why = (
                f"not reached: the notebook ran out of time ({timeout:g} s)"
                if run.wall_timeout
                else "not run"
            )
            results.append(CheckResult(name, points, 0, why))
        elif outcome.passed:
            message = "the check never reached the grader (was serve replaced?)"
            results.append(CheckResult(name, points, 0, message))
        else:
            results.append(CheckResult(name, points, 0, clip(explain_failure(outcome))))
    return results


def explain_failure(outcome) -> str:
    error = strip_ansi(outcome.error).strip()
    if outcome.killed_kernel:
        return "the kernel died while this cell ran (os._exit, a crash, or out of memory)"
    if outcome.timed_out:
        return f"timed out ({strip_ansi(outcome.message).split('.')[0]}); an endless loop?"
    if error.startswith("AssertionError: "):
        return error[len("AssertionError: ") :]
    if error.startswith("NameError: "):
        return f"not implemented yet ({error}: did the exercise cell run without errors?)"
    return error or strip_ansi(outcome.message) or "failed"


def run_notes(run, cell_timeout, timeout) -> list:
    outcomes = list(run.cells.values())
    notes = []
    if any(outcome.killed_kernel for outcome in outcomes):
        notes.append("kernel died (os._exit?)")
    if any(outcome.timed_out and not outcome.killed_kernel for outcome in outcomes):
        notes.append(f"cell timeout ({cell_timeout:g} s)")
    if any(outcome.error.startswith("SystemExit") for outcome in outcomes):
        notes.append("sys.exit() called")
    if run.wall_timeout:
        notes.append(f"timeout (notebook over {timeout:g} s)")
    if run.unreadable_records:
        notes.append(f"review: the run's records were unreadable ({run.unreadable_records})")
    return notes


def clip(text: str, limit=MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text or "")


def last_line(text: str) -> str:
    lines = [line for line in strip_ansi(text).splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"
