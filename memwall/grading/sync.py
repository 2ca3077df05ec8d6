"""Keep exercises/ in step with solutions/: `memwall exercises [--check]`.

exercises/ is generated, never edited by hand, so "in sync" means: regenerating every student
copy from its solution changes nothing that matters (cell ids, types, sources and metadata, and
the notebook's memwall metadata). Outputs and formatting do not count.
"""

from pathlib import Path

import nbformat

from memwall.grading.cells import METADATA_KEY
from memwall.grading.student_copy import cell_source
from memwall.notebooks import practice_data, read_source, student_copy


def sync_exercises(solutions_dir="solutions", exercises_dir="exercises", check=False) -> list:
    """Regenerate exercises/ (or, with ``check=True``, only compare).

    Returns the notebooks that were out of sync, as sentences; with ``check=False`` they have
    been rewritten (and stale generated copies removed) by the time this returns.
    """
    solutions_dir, exercises_dir = Path(solutions_dir), Path(exercises_dir)
    out_of_sync = []
    solution_paths = notebooks_in(solutions_dir)
    for solution_path in solution_paths:
        expected, data = student_copy(solution_path, read_notebook(solution_path))
        out_of_sync += write_data(data, check)
        target = exercises_dir / f"{solution_path.stem}.ipynb"
        if target.exists() and notebook_signature(read_notebook(target)) == notebook_signature(
            expected
        ):
            continue
        out_of_sync.append(
            f"{target}: {'differs from' if target.exists() else 'missing for'} {solution_path}"
        )
        if not check:
            exercises_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(nbformat.writes(expected) + "\n")  # as `memwall notebooks` writes it
    # the practice cases the student copies' check cells compare with
    out_of_sync += write_data(practice_data(solutions_dir / "checks"), check)
    solution_names = {path.stem for path in solution_paths}
    for stale in sorted(exercises_dir.glob("*.ipynb")):
        if stale.stem not in solution_names:
            out_of_sync.append(f"{stale}: has no solution in {solutions_dir}")
            if not check and is_generated(read_notebook(stale)):
                stale.unlink()
    return out_of_sync


def write_data(data: dict, check: bool) -> list:
    """Write the data files a student copy reads (recorded curves, practice cases) into the
    package."""
    package_root = Path(__file__).resolve().parents[2]
    changed = []
    for relative, text in data.items():
        target = package_root / relative
        if target.is_file() and target.read_text() == text:
            continue
        changed.append(f"{target}: out of date")
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return changed


def notebook_signature(nb):
    """What must agree between a committed student copy and a freshly generated one."""
    cells = [
        (cell.get("id"), cell.get("cell_type"), cell_source(cell), cell.get("metadata", {}))
        for cell in nb.cells
    ]
    return cells, nb.metadata.get(METADATA_KEY, {})


def is_generated(nb) -> bool:
    return bool(nb.metadata.get(METADATA_KEY, {}).get("solution_sha256"))


def notebooks_in(folder: Path) -> list:
    """The solution notebooks of a folder: its MyST sources (*.md), or else its *.ipynb."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    for pattern in ("*.md", "*.ipynb"):
        found = sorted(path for path in folder.glob(pattern) if not path.name.startswith("."))
        if found:
            return found
    return []


def read_notebook(path):
    """A notebook, read from .ipynb or from a MyST source (with its Colab cell and cell ids)."""
    path = Path(path)
    if path.suffix == ".md":
        return read_source(path)
    return nbformat.read(str(path), as_version=4)
