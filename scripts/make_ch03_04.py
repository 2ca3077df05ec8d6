"""Write chapters 3 and 4, their solution notebooks, and the generated exercise copies.

    .venv/bin/python scripts/make_ch03_04.py

The notebooks' text lives in scripts/notebooks_ch03_04/*.txt in "percent" format: a line
`# %%` starts a code cell, `# %% [markdown]` a markdown cell, and a JSON object after either
becomes the cell's metadata (e.g. `# %% {"tags": ["remove-cell"]}`). Cell ids are derived from
the file name and position, so regenerating an unchanged notebook changes nothing. Chapters are
stored without outputs (the book build executes them). Exercise copies are generated with
memwall's own `make_student_copy`, for these two chapters only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbcells import COLAB_INSTALL  # noqa: E402

SOURCES = Path(__file__).resolve().parent / "notebooks_ch03_04"
NOTEBOOKS = {  # source file -> notebook written from it
    "chapter_03.txt": "chapters/03_memory_wall.ipynb",
    "chapter_04.txt": "chapters/04_kv_cache.ipynb",
    "solution_03.txt": "solutions/03_memory_wall.ipynb",
    "solution_04.txt": "solutions/04_kv_cache.ipynb",
}
MARKER = "# %%"


def parse_cells(text: str, prefix: str) -> list:
    """Percent-format text -> nbformat cells (the Colab cell first), with stable ids."""
    cells = [new_code_cell(COLAB_INSTALL, metadata={"tags": ["remove-cell"]})]
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKER):
            blocks.append((line[len(MARKER):].strip(), []))
        elif blocks:
            blocks[-1][1].append(line)
    for header, lines in blocks:
        kind = "markdown" if header.startswith("[markdown]") else "code"
        header = header.removeprefix("[markdown]").strip()
        metadata = json.loads(header) if header else {}
        source = "\n".join(lines).strip("\n")
        cells.append(new_markdown_cell(source, metadata=metadata) if kind == "markdown"
                     else new_code_cell(source, metadata=metadata))
    for number, cell in enumerate(cells):
        cell["id"] = f"{prefix}-{number:02d}"
    return cells


def build(source_name: str) -> nbformat.NotebookNode:
    nb = new_notebook(cells=parse_cells((SOURCES / source_name).read_text(), Path(source_name).stem))
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    return nb


def main() -> int:
    from memwall.grading import make_student_copy, validate_solution

    for source_name, target in NOTEBOOKS.items():
        if not (SOURCES / source_name).exists():
            print(f"skipped {target}: no {SOURCES / source_name}", file=sys.stderr)
            continue
        nb = build(source_name)
        if target.startswith("solutions/"):
            problems = validate_solution(nb)
            if problems:
                print(f"{target}: {problems}", file=sys.stderr)
                return 1
            exercise = make_student_copy(nb, Path(target).name)
            nbformat.write(exercise, REPO / "exercises" / Path(target).name)
            print("wrote", "exercises/" + Path(target).name)
        nbformat.validate(nb)
        nbformat.write(nb, REPO / target)
        print("wrote", target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
