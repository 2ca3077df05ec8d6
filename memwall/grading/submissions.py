"""Find the submissions in a folder and tell whose they are and which chapter.

Two layouts are accepted, and can be mixed:

    submissions/alice__01_two_phases.ipynb     (student, two underscores, chapter)
    submissions/alice/01_two_phases.ipynb      (one folder per student)

The chapter part must be the name of a notebook in solutions/ (``01_two_phases``). Hidden files,
``.ipynb_checkpoints`` and anything that is not ``.ipynb`` are skipped. Names are normalised to
Unicode NFC, so "José" typed two ways is one student; a name that is not UTF-8 (a Latin-1 zip)
is read as Latin-1, and control characters never reach the CSV or the terminal (names.py). A symbolic link (file or student folder)
is refused rather than followed: it could point at another student's work or at the solutions.
Two files for the same student and chapter are both reported as duplicates, not graded.

A renamed copy of a chapter's notebook (``alice__03_memory_wall (1).ipynb``,
``alice/Copy of 03_memory_wall.ipynb``, another letter case) is graded as the chapter its own
metadata names: every student copy records the solution it was made from (``generated_from``).
"""

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from memwall.grading.names import feedback_file_name, readable
from memwall.grading.safe_files import UnsafeFile, read_regular

SEPARATOR = "__"
MAX_NOTEBOOK_BYTES = 32 * 2**20
# A real chapter has well under 200 cells; a notebook of 100,000 would cost the whole timeout
# and gigabytes of the grader's memory before it ran, so it is refused before it is restored.
MAX_CELLS = 2_000
REFUSED_LINK = "refused: a symbolic link (hand in the notebook itself)"


@dataclass(frozen=True)
class Submission:
    student: str
    chapter: str  # "" when the file name does not say
    path: Path
    problem: str = ""  # set when the file must not be graded (a link, a duplicate)
    renamed: bool = False  # the chapter was read from the notebook, not from its file name

    @property
    def notebook(self) -> str:
        return f"{self.chapter}.ipynb" if self.chapter else self.path.name

    @property
    def feedback_name(self) -> str:
        return feedback_file_name(self.student, self.chapter or nfc(self.path.stem))


def find_submissions(folder, chapters=None) -> tuple:
    """(submissions sorted by student and chapter, paths that were skipped). With `chapters`
    (the solutions' names), a file whose name holds none of them takes its notebook's."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no submissions folder {folder}")
    found, skipped = [], []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_symlink():
            if path.suffix == ".ipynb" or path.is_dir():
                student, chapter = split_name(path.stem)
                found.append(Submission(student or nfc(path.stem), chapter, path, REFUSED_LINK))
            else:
                skipped.append(path)
        elif path.is_dir():
            for inner in sorted(path.iterdir()):
                if inner.is_symlink() and inner.suffix == ".ipynb":
                    found.append(Submission(nfc(path.name), nfc(inner.stem), inner, REFUSED_LINK))
                elif is_notebook(inner):
                    found.append(Submission(nfc(path.name), nfc(inner.stem), inner))
                elif not inner.name.startswith("."):
                    skipped.append(inner)
        elif is_notebook(path):
            student, chapter = split_name(path.stem)
            found.append(
                Submission(student, chapter, path)
                if student
                else Submission(nfc(path.stem), "", path)
            )
        else:
            skipped.append(path)
    if chapters is not None:
        found = [chapter_from_notebook(s, chapters) for s in found]
    found = mark_duplicates(found, folder)
    return sorted(found, key=lambda s: (s.student, s.chapter, s.path.name)), skipped


def mark_duplicates(found, folder) -> list:
    """`found`, each file that shares its student and chapter with another marked as a duplicate,
    named, since the CSV's student and notebook columns cannot tell the two apart."""
    counts = Counter((s.student, s.chapter) for s in found if s.chapter)
    marked = []
    for submission in found:
        key = (submission.student, submission.chapter)
        if submission.chapter and counts[key] > 1 and not submission.problem:
            others = counts[key] - 1
            problem = (
                f"duplicate: {readable(str(submission.path.relative_to(folder)))} and {others} "
                f"other file{'s' * (others > 1)} for this student and chapter"
            )
            submission = replace(submission, problem=problem)
        marked.append(submission)
    return marked


def chapter_from_notebook(submission: Submission, chapters) -> Submission:
    """`submission` with the chapter its notebook was made from, when its file name holds no
    chapter of `chapters` but the notebook is a copy of one. A file whose name names no student
    keeps its empty chapter: whose work it is cannot be guessed."""
    if submission.problem or not submission.chapter or submission.chapter in chapters:
        return submission
    chapter = notebook_chapter(submission.path)
    return replace(submission, chapter=chapter, renamed=True) if chapter in chapters else submission


def notebook_chapter(path: Path) -> str:
    """The chapter the notebook at `path` records ("" if none, or not a notebook)."""
    nb, _ = read_submission(path)
    return recorded_chapter(nb) if nb is not None else ""


def recorded_chapter(nb) -> str:
    """The chapter a student copy records it was made from ("" if none)."""
    marks = nb.metadata.get("memwall")
    source = marks.get("generated_from") if isinstance(marks, dict) else None
    return nfc(Path(str(source)).stem) if source else ""


def split_name(stem: str) -> tuple:
    """(student, chapter) of ``student__chapter``, each made readable ("" when no separator)."""
    student, _, chapter = stem.rpartition(SEPARATOR)
    return (nfc(student), nfc(chapter)) if student else ("", nfc(chapter))


def nfc(name: str) -> str:
    """A name from the file system as safe, normalised text (names.readable)."""
    return readable(name)


def is_notebook(path: Path) -> bool:
    return (
        not path.is_symlink()
        and path.is_file()
        and path.suffix.lower() == ".ipynb"
        and not path.name.startswith(".")
    )


def read_submission(path: Path):
    """(notebook, None) or (None, what is wrong with the file)."""
    import nbformat

    try:
        data = read_regular(path, MAX_NOTEBOOK_BYTES)
    except UnsafeFile as error:
        hint = " (clear its outputs and hand it in again)" if "is over" in str(error) else ""
        return None, f"refused: {error}{hint}"
    if not data.strip():
        return None, "empty file"
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, "not JSON"
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        return None, "not a notebook"
    cells = raw.get("cells", raw.get("worksheets"))
    if len(cells) > MAX_CELLS:
        return None, f"refused: {len(cells)} cells (a submission may have at most {MAX_CELLS})"
    try:
        nb = nbformat.reads(data.decode("utf-8"), as_version=4, capture_validation_error={})
        nb.cells = [cell for cell in nb.cells if isinstance(cell, dict)]
    except Exception as error:
        return None, f"not a notebook: {type(error).__name__}"
    if not nb.cells:
        return None, "empty notebook"
    return nb, None
