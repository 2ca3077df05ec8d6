"""Find the submissions in a folder and tell whose they are and which chapter.

Two layouts are accepted, and can be mixed:

    submissions/alice__01_two_phases.ipynb     (student, two underscores, chapter)
    submissions/alice/01_two_phases.ipynb      (one folder per student)

The chapter part must be the name of a notebook in solutions/ (``01_two_phases``). Hidden files,
``.ipynb_checkpoints`` and anything that is not ``.ipynb`` are skipped.
"""

from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "__"


@dataclass(frozen=True)
class Submission:
    student: str
    chapter: str  # "" when the file name does not say
    path: Path

    @property
    def notebook(self) -> str:
        return f"{self.chapter}.ipynb" if self.chapter else self.path.name

    @property
    def feedback_name(self) -> str:
        return f"{self.student}{SEPARATOR}{self.chapter or self.path.stem}.txt"


def find_submissions(folder) -> tuple:
    """(submissions sorted by student and chapter, paths that were skipped)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no submissions folder {folder}")
    found, skipped = [], []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_dir():
            for inner in sorted(path.iterdir()):
                if is_notebook(inner):
                    found.append(Submission(path.name, inner.stem, inner))
                elif not inner.name.startswith("."):
                    skipped.append(inner)
        elif is_notebook(path):
            student, _, chapter = path.stem.rpartition(SEPARATOR)
            found.append(
                Submission(student, chapter, path) if student else Submission(path.stem, "", path)
            )
        else:
            skipped.append(path)
    return sorted(found, key=lambda s: (s.student, s.chapter, s.path.name)), skipped


def is_notebook(path: Path) -> bool:
    return path.is_file() and path.suffix == ".ipynb" and not path.name.startswith(".")
