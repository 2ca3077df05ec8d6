"""What the grader writes: grades.csv, one feedback file per notebook, a terminal summary, and
a one-page Markdown summary for the instructor beside the CSV (``summary.py``).

Everything is written atomically (safe_files.write_atomically) and again each time a row
finishes, so the CSV always holds every finished row. Results of an earlier run at the same
paths (the CSV, its summary, the feedback folder) are kept under numbered names (``grades.csv``
-> ``grades.csv.~1~``, as ``cp --backup=numbered`` does) before the first row is written: a rerun
for a late submission never loses the class's grades, and no stale feedback file is mixed in.
A cell that a spreadsheet would run as a formula (starting with = + - @, a tab or a carriage
return) gets a leading apostrophe. A feedback file is cut at FEEDBACK_MAX_CHARACTERS.
"""

import csv
import io
import sys
from pathlib import Path

from memwall.grading.names import printable, printable_lines, readable
from memwall.grading.safe_files import write_atomically
from memwall.grading.summary import students_told_apart_by_case, summary_path, write_summary

FIXED_COLUMNS = ("student", "notebook")
TOTAL_COLUMNS = ("total", "max", "status")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
FEEDBACK_MAX_CHARACTERS = 64 * 1024


class ReportWriter:
    """Collects rows as they finish and keeps grades.csv and the feedback files up to date."""

    def __init__(self, out_csv, feedback_dir=None):
        self.out_csv, self.feedback_dir = Path(out_csv), feedback_dir
        self.rows, self._feedback_names = [], set()
        for path in [self.out_csv] + ([Path(feedback_dir)] if feedback_dir is not None else []):
            if path.is_symlink():
                raise ValueError(f"{path} is a symbolic link; choose another path")
        if self.out_csv.exists() and not self.out_csv.is_file():
            raise ValueError(f"{self.out_csv} exists and is not a file; choose another --out")
        if feedback_dir is not None and Path(feedback_dir).exists():
            if not Path(feedback_dir).is_dir():
                raise ValueError(f"{feedback_dir} exists and is not a folder")
        self.kept = None  # earlier results moved aside (path -> its numbered name), once

    def _keep_earlier(self):
        """Move an earlier run's results aside, just before this run writes its first."""
        if self.kept is not None:
            return
        self.kept = {}
        earlier = [self.out_csv, summary_path(self.out_csv)]
        if self.feedback_dir is not None:
            earlier.append(Path(self.feedback_dir))
        for path in earlier:
            if path.exists() and not (path.is_dir() and not any(path.iterdir())):
                self.kept[path] = keep_aside(path)
                print(f"kept the earlier {path} as {self.kept[path]}", file=sys.stderr)

    def add(self, row):
        self._keep_earlier()
        name, number = row.feedback_name, 2
        while name in self._feedback_names:  # duplicates would overwrite each other's feedback
            name, number = f"{Path(row.feedback_name).stem}-{number}.txt", number + 1
        row.feedback_name = name
        self._feedback_names.add(name)
        self.rows.append(row)
        self.rows.sort(key=lambda r: (r.student, r.notebook, r.feedback_name))
        if self.feedback_dir is not None:
            try:
                Path(self.feedback_dir).mkdir(parents=True, exist_ok=True)
                write_feedback(row, Path(self.feedback_dir) / row.feedback_name)
            except (OSError, ValueError) as error:  # this row says so; the batch goes on
                row.status = f"{row.status}; grader error: feedback not written: {error}"
                row.graded = False
        write_csv(self.rows, self.out_csv)

    def finish(self):
        self._keep_earlier()
        write_csv(self.rows, self.out_csv)
        write_summary(self.rows, self.out_csv)  # the instructor's one-page overview


def keep_aside(path: Path) -> Path:
    """Rename `path` to the first free `path.~N~`, and return that name."""
    number = 1
    while (backup := path.with_name(f"{path.name}.~{number}~")).exists():
        number += 1
    path.rename(backup)
    return backup


class OutputLock:
    """An exclusive lock on ``--out`` for the whole run: a second run on the same CSV stops with
    a clear message instead of the two overwriting each other's rows."""

    def __init__(self, out_csv):
        self.path = Path(out_csv).with_name(f".{Path(out_csv).name}.lock")
        self.handle = None

    def __enter__(self):
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a")  # noqa: SIM115 (held until __exit__)
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise ValueError(
                f"another memwall grade is writing {self.path.with_name(self.path.name[1:-5])}; "
                "wait for it to finish or choose another --out"
            ) from None
        return self

    def __exit__(self, *exc):
        self.handle.close()  # closing releases the lock


def write_csv(rows, out_csv):
    """One row per (student, notebook); one column per check, in chapter then notebook order."""
    check_columns = []
    for row in sorted(rows, key=lambda r: r.chapter):
        for result in row.checks:
            if result.name not in check_columns:
                check_columns.append(result.name)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([*FIXED_COLUMNS, *check_columns, *TOTAL_COLUMNS])
    for row in rows:
        # A notebook that could not be graded has no score (empty cells), not a zero.
        earned = {result.name: number(result.earned) for result in row.checks if row.graded}
        total = number(row.total) if row.graded else ""
        writer.writerow(
            [safe_cell(row.student), safe_cell(row.notebook)]
            + [earned.get(name, "") for name in check_columns]
            + [total, number(row.max_points), safe_cell(row.status)]
        )
    write_atomically(out_csv, buffer.getvalue())


def safe_cell(text: str) -> str:
    """``text`` without control characters, with a leading apostrophe when a spreadsheet would
    read it as a formula."""
    text = printable(text)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def write_feedback(row, path):
    """A plain-text report for one student: score, status, and each check's result."""
    score = f"{number(row.total)} / {number(row.max_points)}" if row.graded else "not graded"
    lines = [
        f"memwall feedback for {row.student}: {row.notebook}",
        f"score: {score}",
        f"status: {row.status}",
        "",
    ]
    for result in row.checks if row.graded else ():
        passed = result.earned == result.points and result.points
        lines.append(
            f"{'✓' if passed else '✗'} {result.name} ({number(result.earned)}/{number(result.points)} points)"
        )
        lines += [f"    {line}" for line in result.message.splitlines()]
    if "restored" in row.status:
        lines += [
            "",
            "Check cells and cell order were put back as in the handed-out notebook;",
            "only the original checks count.",
        ]
    text = printable_lines("\n".join(lines)) + "\n"
    if len(text) > FEEDBACK_MAX_CHARACTERS:
        text = text[: FEEDBACK_MAX_CHARACTERS - 40] + "\n[feedback cut at the size limit]\n"
    write_atomically(path, text)


def print_summary(rows, skipped, out_csv, feedback_dir, seconds):
    problems = [row for row in rows if not row.ok]
    students = {row.student for row in rows}
    print(
        f"graded {len(rows)} notebooks from {len(students)} students in {seconds:.0f} s -> {out_csv}"
    )
    if feedback_dir is not None:
        print(f"feedback files in {feedback_dir}/")
    print(f"summary for the instructor: {summary_path(out_csv)}")
    for row in problems:
        print(printable(f"  {row.student}, {row.notebook}: {row.status}"))
    for group in students_told_apart_by_case(students):
        print(printable(f"  names that differ only in letter case: {' / '.join(group)}"))
    if skipped:
        names = ", ".join(readable(p.name) for p in skipped)
        print(
            f"skipped {len(skipped)} files that are not notebooks (unpack archives; "
            f"a student's folder holds notebooks, not folders): {names}"
        )


def number(value):
    """2.0 -> 2 so the CSV reads like points, not floats."""
    return int(value) if float(value).is_integer() else round(value, 3)
