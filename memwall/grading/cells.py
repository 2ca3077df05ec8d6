"""How memwall marks the cells of an exercise notebook.

All of memwall's marks live under one key of the cell metadata, ``"memwall"``:

- an exercise cell: ``{"memwall": {"solution": "ch01.ttft", "hint": "..."}}``; its source holds
  ``### BEGIN SOLUTION`` ... ``### END SOLUTION``;
- a check cell: ``{"memwall": {"check": "ch01.ttft", "points": 2}}``.

The grader matches cells by these ids, never by position, so a student who moves cells around
still gets the right cells graded.
"""

import re

METADATA_KEY = "memwall"
BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"

# An exercise cell and its check cell usually share one id, e.g. "ch01.ttft":
# the prefix names the check module of the answer key (solutions/checks/ch01.py).
EXERCISE_ID = re.compile(r"^[a-z][a-z0-9_]*\.[a-z0-9_.]+$")


def memwall_metadata(cell) -> dict:
    metadata = cell.get("metadata")
    # Submitted notebooks can hold anything; a malformed cell simply has no memwall marks.
    marks = metadata.get(METADATA_KEY) if isinstance(metadata, dict) else None
    return marks if isinstance(marks, dict) else {}


def exercise_id(cell):
    """The id of the exercise a solution cell answers, or None."""
    if cell.get("cell_type") != "code":
        return None
    value = memwall_metadata(cell).get("solution")
    return value if isinstance(value, str) else None


def check_name(cell):
    """The registered check a check cell calls, or None."""
    if cell.get("cell_type") != "code":
        return None
    value = memwall_metadata(cell).get("check")
    return value if isinstance(value, str) else None


def check_points(cell) -> float:
    points = memwall_metadata(cell).get("points", 0)
    return points if isinstance(points, (int, float)) and not isinstance(points, bool) else 0


def exercise_hint(cell) -> str:
    return str(memwall_metadata(cell).get("hint", "replace this line with your code"))


def has_solution_markers(source: str) -> bool:
    return BEGIN_SOLUTION in source


def check_cells(nb):
    """(code cell index, check name, points) for every check cell, in notebook order."""
    found = []
    for index, cell in enumerate(code_cells(nb)):
        name = check_name(cell)
        if name is not None:
            found.append((index, name, check_points(cell)))
    return found


def code_cells(nb):
    # nbval numbers only the code cells ("Cell 0", "Cell 1", ...), so do we.
    return [cell for cell in nb.cells if cell.get("cell_type") == "code"]
