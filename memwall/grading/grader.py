"""The instructor's grader: ``grade(submissions_dir, out_csv, ...)``, i.e. `memwall grade`.

For each submitted notebook: read it (reporting files that are not notebooks), match it to its
solution by chapter name, restore the solution's check cells around the student's exercise code
(restore.py), run it under nbval with time limits (execute.py), and score each check cell by
whether it passed. One problem never stops the batch: every submission gets a row, and the
row's status says what went wrong.
"""

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from memwall.grading.cells import check_cells
from memwall.grading.checking import PASS_MARK
from memwall.grading.execute import kill_running_notebooks, run_notebook
from memwall.grading.restore import restore_submission
from memwall.grading.submissions import Submission, find_submissions
from memwall.grading.sync import notebooks_in, read_notebook
from memwall.grading.tampering import tampering_flags

# Generous defaults: a real chapter may load a model (about 20 s cold) before its checks run.
DEFAULT_NOTEBOOK_TIMEOUT = 900
DEFAULT_CELL_TIMEOUT = 300
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class CheckResult:
    name: str
    points: float
    earned: float
    message: str  # the pass line, or why it failed


@dataclass
class GradeRow:
    student: str
    notebook: str
    chapter: str
    checks: list = field(default_factory=list)
    status: str = "ok"
    max_points: float = 0
    seconds: float = 0.0
    feedback_name: str = ""

    @property
    def total(self) -> float:
        return sum(result.earned for result in self.checks)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def grade(
    submissions_dir,
    out_csv,
    feedback_dir=None,
    timeout=DEFAULT_NOTEBOOK_TIMEOUT,
    cell_timeout=DEFAULT_CELL_TIMEOUT,
    jobs=1,
    solutions_dir="solutions",
    progress=True,
) -> list:
    """Grade every notebook in ``submissions_dir``; write ``out_csv`` (and feedback); return the rows."""
    from tqdm.auto import tqdm

    from memwall.grading.report import print_summary, write_csv, write_feedback

    started = time.monotonic()
    submissions, skipped = find_submissions(submissions_dir)
    solutions = SolutionBook(solutions_dir)
    jobs = max(1, int(jobs))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    rows = []
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = [
        pool.submit(grade_submission, submission, solutions, timeout, cell_timeout, threads)
        for submission in submissions
    ]
    try:
        for future in tqdm(
            as_completed(futures),
            total=len(futures),
            desc="grading",
            unit="nb",
            disable=not progress,
        ):
            rows.append(future.result())
    except KeyboardInterrupt:
        # Ctrl-C should stop now, not after every queued notebook has run to its timeout.
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running_notebooks()
        raise
    pool.shutdown()
    rows.sort(key=lambda row: (row.student, row.notebook))
    write_csv(rows, out_csv)
    if feedback_dir is not None:
        Path(feedback_dir).mkdir(parents=True, exist_ok=True)
        for row in rows:
            write_feedback(row, Path(feedback_dir) / row.feedback_name)
    if progress:
        print_summary(rows, skipped, out_csv, feedback_dir, time.monotonic() - started)
    return rows


class SolutionBook:
    """The solution notebooks, read once and shared by every job."""

    def __init__(self, solutions_dir):
        self.folder = Path(solutions_dir)
        self._cache = {}

    def get(self, chapter):
        if chapter not in self._cache:
            paths = {path.stem: path for path in notebooks_in(self.folder)}
            path = paths.get(chapter) if chapter else None
            self._cache[chapter] = read_notebook(path) if path is not None else None
        return self._cache[chapter]


def grade_submission(
    submission: Submission, solutions, timeout, cell_timeout, threads=None
) -> GradeRow:
    """Grade one notebook; never raises, a failure becomes the row's status."""
    started = time.monotonic()
    row = GradeRow(submission.student, submission.notebook, submission.chapter)
    row.feedback_name = submission.feedback_name
    try:
        _grade_into(row, submission, solutions, timeout, cell_timeout, threads)
    except Exception as error:  # one broken submission must not stop the batch
        row.status = f"grader error: {type(error).__name__}: {error}"
    row.seconds = time.monotonic() - started
    return row


def _grade_into(row, submission, solutions, timeout, cell_timeout, threads):
    if not submission.chapter:
        row.status = "bad file name: expected <student>__NN_slug.ipynb"
        return
    solution = solutions.get(submission.chapter)
    if solution is None:
        row.status = f"wrong chapter: no solution for {submission.chapter}"
        return
    row.checks = [
        CheckResult(name, points, 0, "not run") for _, name, points in check_cells(solution)
    ]
    row.max_points = sum(result.points for result in row.checks)
    nb, problem = read_submission(submission.path)
    if problem:
        row.status = problem
        return
    restored = restore_submission(solution, nb)
    if restored.matched_exercises == 0:
        row.status = wrong_chapter_status(nb, submission.chapter)
        return
    run = run_notebook(restored.nb, cell_timeout, timeout, threads)
    notes = restored.notes + run_notes(run, cell_timeout, timeout)
    notes += [f"review: {flag}" for flag in tampering_flags(restored.student_sources)]
    if run.forged_records:
        notes.append("review: forged grading results (ignored)")
    row.checks = score_checks(restored.nb, run, timeout)
    if not run.cells and not run.wall_timeout:
        notes.append(f"notebook did not run: {last_line(run.log_tail)}")
    row.status = "; ".join(notes) or "ok"


def read_submission(path: Path):
    """(notebook, None) or (None, what is wrong with the file)."""
    data = path.read_bytes()
    if not data.strip():
        return None, "empty file"
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, "not JSON"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        return None, "not a notebook"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4, capture_validation_error={})
        nb.cells = [cell for cell in nb.cells if isinstance(cell, dict)]
    except Exception as error:
        return None, f"not a notebook: {type(error).__name__}"
    if not nb.cells:
        return None, "empty notebook"
    return nb, None


def wrong_chapter_status(nb, chapter) -> str:
    source = (
        nb.metadata.get("memwall", {}).get("generated_from")
        if isinstance(nb.metadata.get("memwall"), dict)
        else None
    )
    if source and Path(str(source)).stem != chapter:
        return f"wrong chapter: contains {Path(str(source)).stem} exercises"
    return f"wrong chapter: no exercise of {chapter} found"


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
    return notes


def score_checks(nb, run, timeout) -> list:
    results = []
    for index, name, points in check_cells(nb):
        outcome = run.cells.get(index)
        if outcome is None or not outcome.ran:
            why = (
                f"not reached: the notebook ran out of time ({timeout:g} s)"
                if run.wall_timeout
                else "not run"
            )
            results.append(CheckResult(name, points, 0, why))
        elif outcome.passed and f"{PASS_MARK} {name}:" in outcome.stdout:
            results.append(CheckResult(name, points, points, pass_line(outcome.stdout, name)))
        elif outcome.passed:
            results.append(
                CheckResult(name, points, 0, "the check printed no result (was `check` replaced?)")
            )
        else:
            results.append(CheckResult(name, points, 0, explain_failure(outcome)))
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


def pass_line(stdout, name) -> str:
    """What the check said on success, e.g. "12/12 cases passed"."""
    prefix = f"{PASS_MARK} {name}:"
    for line in stdout.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    return "passed"


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text or "")


def last_line(text: str) -> str:
    lines = [line for line in strip_ansi(text).splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"
