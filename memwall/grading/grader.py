"""The instructor's grader: ``grade(submissions_dir, out_csv, ...)``, i.e. `memwall grade`.

For each submitted notebook: read it defensively (reporting files that are not notebooks,
links and duplicates), match it to its solution by chapter name, restore the solution's cells
around the student's exercise code (restore.py), turn the check cells into ``serve`` cells
(serve_cells.py), and run it sandboxed with time limits (execute.py, sandbox.py) while the grader
judges every check itself through the grading channel (channel.py). One problem never stops the
batch: every submission gets a row, and the row's status says what went wrong. The CSV and the
feedback files are rewritten atomically as rows finish, so an interrupted batch leaves the rows
it finished.
"""

import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from memwall.grading.answer_key import key_folder, use_key
from memwall.grading.cells import check_cells
from memwall.grading.channel import GraderChannel
from memwall.grading.copied import copied_flags, key_fingerprints
from memwall.grading.execute import Setup, kill_running_notebooks, run_notebook
from memwall.grading.readiness import check_ready, resolve_sandbox
from memwall.grading.registry import get_check
from memwall.grading.restore import restore_submission
from memwall.grading.sandbox import Limits, Sandbox
from memwall.grading.scoring import CheckResult, explain_failure, last_line, run_notes, score_checks
from memwall.grading.serve_cells import serve_checks
from memwall.grading.submissions import (
    Submission,
    find_submissions,
    notebook_chapter,
    read_submission,
    recorded_chapter,
)
from memwall.grading.sync import notebooks_in, read_notebook
from memwall.grading.tampering import tampering_flags

__all__ = [
    "grade", "grade_submission", "check_ready", "explain_failure", "read_submission", "SolutionBook",
]  # fmt: skip

# Generous defaults: a real chapter may load a model (about 20 s cold) before its checks run.
DEFAULT_NOTEBOOK_TIMEOUT = 900
DEFAULT_CELL_TIMEOUT = 300


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
    graded: bool = True  # False: the grader could not grade it (see status); exit code 1

    @property
    def total(self) -> float:
        return sum(result.earned for result in self.checks)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Options:
    timeout: float
    cell_timeout: float
    call_timeout: float
    sandbox: bool
    threads: int
    limits: Limits
    read_only_paths: tuple


def grade(
    submissions_dir,
    out_csv,
    feedback_dir=None,
    timeout=DEFAULT_NOTEBOOK_TIMEOUT,
    cell_timeout=DEFAULT_CELL_TIMEOUT,
    jobs=1,
    solutions_dir="solutions",
    progress=True,
    sandbox="auto",
    call_timeout=None,
    limits=Limits(),
    read_only_paths=(),
) -> list:
    """Grade every notebook in ``submissions_dir``; write ``out_csv`` (and feedback); return the rows.

    ``sandbox``: "auto" (bubblewrap where it works, else a warning), True (required) or False.
    ``call_timeout``: the limit on one call of a student's function (default: ``cell_timeout``).
    """
    try:  # a progress bar when tqdm is installed (it is not part of the [grade] extra)
        from tqdm.auto import tqdm
    except ImportError:

        def tqdm(items, **options):
            return items

    from memwall.grading.report import OutputLock

    check_ready(timeout, cell_timeout, jobs, call_timeout)
    use_sandbox = resolve_sandbox(sandbox, limits, read_only_paths)
    solutions = SolutionBook(solutions_dir)
    submissions, skipped = find_submissions(submissions_dir, solutions.chapters())
    if not submissions:  # before anything is written: an earlier run's grades stay as they are
        raise ValueError(f"no notebooks to grade in {submissions_dir}" + (
            f" ({len(skipped)} other files skipped)" if skipped else ""))  # fmt: skip
    with OutputLock(out_csv):  # a second run on the same --out stops here, with a message
        return _grade_locked(
            submissions, skipped, solutions, out_csv, feedback_dir, progress, tqdm,
            Options(
                float(timeout), float(cell_timeout), float(call_timeout or cell_timeout),
                use_sandbox, max(1, (os.cpu_count() or 1) // int(jobs)), limits,
                tuple(read_only_paths),
            ),
            int(jobs),
        )  # fmt: skip


def _grade_locked(submissions, skipped, solutions, out_csv, feedback_dir, progress, tqdm,
                  options, jobs):  # fmt: skip
    from memwall.grading.report import ReportWriter, print_summary

    started = time.monotonic()
    writer = ReportWriter(out_csv, feedback_dir)  # refuses a directory where the CSV goes
    use_key(solutions.find_key())  # the references: beside the solutions, never in the package
    pool = ThreadPoolExecutor(max_workers=jobs)
    futures = {pool.submit(grade_submission, s, solutions, options): s for s in submissions}
    try:
        for future in tqdm(
            as_completed(futures), total=len(futures), desc="grading", unit="nb",
            disable=not progress,
        ):  # fmt: skip
            writer.add(_row_of(future, futures[future]))
    except KeyboardInterrupt:
        # Ctrl-C should stop now, not after every queued notebook has run to its timeout.
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running_notebooks()
        raise
    pool.shutdown()
    writer.finish()
    if progress:
        print_summary(writer.rows, skipped, out_csv, feedback_dir, time.monotonic() - started)
    return writer.rows


def _row_of(future, submission):
    """The finished row; a grader failure becomes that row's status, never the batch's end."""
    try:
        return future.result()
    except Exception as error:
        row = GradeRow(submission.student, submission.notebook, submission.chapter)
        row.feedback_name = submission.feedback_name
        row.status, row.graded = f"grader error: {type(error).__name__}: {error}", False
        return row


class SolutionBook:
    """The solution notebooks, read once and shared by every job."""

    def __init__(self, solutions_dir):
        self.folder = Path(solutions_dir)
        self.key_folder = self.folder / "checks"
        self._cache = {}
        self._key_prints = None

    def find_key(self) -> Path:
        """``<solutions>/checks``, else the key found from here (answer_key.key_folder)."""
        if not (self.key_folder / "__init__.py").is_file():
            found = key_folder()
            if found is None:
                raise ValueError(
                    f"no answer key: expected {self.key_folder}/__init__.py beside the solutions"
                )
            self.key_folder = found
        return self.key_folder

    def key_prints(self) -> dict:
        """Fingerprints of the key's code, to flag a copied answer (copied.py)."""
        if self._key_prints is None:
            sources = []
            for path in notebooks_in(self.folder):
                nb = read_notebook(path)
                sources += [cell.source for cell in nb.cells if cell.cell_type == "code"]
            self._key_prints = key_fingerprints(self.key_folder, sources)
        return self._key_prints

    def chapters(self) -> set:
        return {path.stem for path in notebooks_in(self.folder)}

    def get(self, chapter):
        if chapter not in self._cache:
            paths = {path.stem: path for path in notebooks_in(self.folder)}
            path = paths.get(chapter) if chapter else None
            self._cache[chapter] = read_notebook(path) if path is not None else None
        return self._cache[chapter]


def grade_submission(submission: Submission, solutions, options: Options) -> GradeRow:
    """Grade one notebook; never raises, a failure becomes the row's status."""
    started = time.monotonic()
    row = GradeRow(submission.student, submission.notebook, submission.chapter)
    row.feedback_name = submission.feedback_name
    try:
        _grade_into(row, submission, solutions, options, started + options.timeout)
    except Exception as error:  # one broken submission must not stop the batch
        row.status, row.graded = f"grader error: {type(error).__name__}: {error}", False
    row.seconds = time.monotonic() - started
    return row


def _grade_into(row, submission, solutions, options, deadline):
    row.graded = False  # until the notebook runs: every early return below is "not graded"
    if not submission.chapter:
        holds = notebook_chapter(submission.path)
        row.status = "bad file name: expected <student>__NN_slug.ipynb" + (
            f" (it holds {holds}: rename it after its student)" if holds else ""
        )
        return
    solution = solutions.get(submission.chapter)
    if solution is None:
        row.status = f"wrong chapter: no solution for {submission.chapter}"
        return
    row.checks = [
        CheckResult(name, points, 0, "not run") for _, name, points in check_cells(solution)
    ]
    row.max_points = sum(result.points for result in row.checks)
    if submission.problem:
        row.status = submission.problem
        return
    nb, problem = read_submission(submission.path)
    if problem:
        row.status = problem
        return
    restored = restore_submission(solution, nb)
    if restored.matched_exercises == 0:
        row.status = wrong_chapter_status(nb, submission.chapter)
        return
    row.graded = True
    # The scan is linear in the code's length and its time counts against the notebook's.
    flags = tampering_flags(restored.student_sources)
    flags += copied_flags(restored.student_sources, solutions.key_prints())
    notebook = serve_checks(restored.nb)
    checks = {name: get_check(name) for _, name, _ in check_cells(notebook)}
    run, verdicts = run_with_channel(notebook, checks, options, deadline - time.monotonic())
    notes = restored.notes + run_notes(run, options.cell_timeout, options.timeout)
    if submission.renamed:
        notes.insert(0, f"chapter read from the notebook (file {submission.path.name})")
    notes += [f"review: {flag}" for flag in flags]
    row.checks = score_checks(notebook, run, verdicts, options.timeout)
    if not run.cells and not run.wall_timeout and not verdicts:
        notes.append(f"notebook did not run: {last_line(run.log_tail)}")
        row.graded = False
    row.status = "; ".join(notes) or "ok"


def run_with_channel(notebook, checks, options, wall_timeout):
    """Run the notebook (sandboxed if asked) while the grader judges its checks: (run, verdicts)."""
    work_dir = Path(tempfile.mkdtemp(prefix="memwall-grade-"))
    os.chmod(work_dir, 0o711)  # the sandbox's unprivileged user passes through, lists nothing
    sandbox = None
    try:
        setup = Setup(work_dir, threads=options.threads, limits=options.limits)
        if options.call_timeout < options.cell_timeout:
            setup.call_limit = options.call_timeout + 1  # the grader gives up first
        setup.channel_dir.mkdir(mode=0o755)
        if options.sandbox:
            sandbox = setup.sandbox = Sandbox(
                work_dir, options.limits, options.read_only_paths, cpus=options.threads
            )
        with GraderChannel(setup.socket_path, checks, options.call_timeout) as channel:
            run = run_notebook(notebook, options.cell_timeout, wall_timeout, options.threads, setup)
        return run, dict(channel.verdicts)
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(work_dir, ignore_errors=True)


def wrong_chapter_status(nb, chapter) -> str:
    holds = recorded_chapter(nb)
    if holds and holds != chapter:
        return f"wrong chapter: contains {holds} exercises"
    return f"wrong chapter: no exercise of {chapter} found"
