"""Turn a solution notebook into the student copy handed out in exercises/.

Each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` span becomes one
``raise NotImplementedError("Exercise N: hint")`` line at the marker's indentation, so a
function body stays valid Python and the student copy runs top to bottom without errors
until a function is called. Everything else is copied, outputs are stripped, and the notebook
metadata records where the copy came from.
"""

import copy
import hashlib
import json
import textwrap

from memwall.grading.cells import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    METADATA_KEY,
    exercise_hint,
    exercise_id,
)

# The widest code line the built page shows whole (tests/test_notebooks.py CODE_COLUMN_CHARS).
PAGE_COLUMNS = 92


def make_student_copy(solution_nb, solution_name=None):
    """Return the student copy of ``solution_nb`` (the input is not modified)."""
    student_nb = copy.deepcopy(solution_nb)
    numbers = exercise_numbers(solution_nb)
    for cell in student_nb.cells:
        strip_outputs(cell)
        source = cell_source(cell)
        if BEGIN_SOLUTION not in source:
            continue
        if cell.get("cell_type") != "code":
            raise ValueError(f"solution markers are only allowed in code cells:\n{source[:200]}")
        ex_id = exercise_id(cell)
        label = f"Exercise {numbers[ex_id]}" if ex_id in numbers else "Exercise"
        cell["source"] = blank_solution_spans(source, f"{label}: {exercise_hint(cell)}")
    marks = {"generated_from": solution_name, "solution_sha256": solution_fingerprint(solution_nb)}
    student_nb.metadata[METADATA_KEY] = {key: value for key, value in marks.items() if value}
    return student_nb


def blank_solution_spans(source: str, message: str) -> str:
    """Replace every marked span of ``source`` by a NotImplementedError carrying ``message``."""
    output, inside = [], False
    for line in source.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(BEGIN_SOLUTION):
            if inside:
                raise ValueError(f"nested {BEGIN_SOLUTION} in:\n{source}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            output.append(not_implemented(indent, message))
        elif stripped.startswith(END_SOLUTION):
            if not inside:
                raise ValueError(f"{END_SOLUTION} without {BEGIN_SOLUTION} in:\n{source}")
            inside = False
        elif not inside:
            output.append(line)
    if inside:
        raise ValueError(f"{BEGIN_SOLUTION} without {END_SOLUTION} in:\n{source}")
    # Keep the cell's own convention of ending with or without a newline.
    text = "".join(output)
    return text if source.endswith("\n") else text.rstrip("\n")


def not_implemented(indent: str, message: str) -> str:
    """``raise NotImplementedError(message)`` at ``indent``, wrapped to fit the page."""
    # json.dumps gives a double-quoted literal that is also valid Python.
    line = f"{indent}raise NotImplementedError({json.dumps(message, ensure_ascii=False)})\n"
    if len(line) <= PAGE_COLUMNS + 1:
        return line
    inner = indent + " " * 4
    width = PAGE_COLUMNS - len(inner) - 3  # the quotes and the space kept at a piece's end
    pieces = textwrap.wrap(message, width, drop_whitespace=False) or [message]
    literals = [f"{inner}{json.dumps(piece, ensure_ascii=False)}\n" for piece in pieces]
    return f"{indent}raise NotImplementedError(\n{''.join(literals)}{indent})\n"


def exercise_numbers(nb) -> dict:
    """Exercise id -> 1-based number, in the order the exercises first appear."""
    numbers = {}
    for cell in nb.cells:
        ex_id = exercise_id(cell)
        if ex_id is not None and ex_id not in numbers:
            numbers[ex_id] = len(numbers) + 1
    return numbers


def solution_fingerprint(nb) -> str:
    """A hash of what the solution says (not of its outputs), to tell copies of it apart."""
    content = [
        (cell.get("cell_type"), cell_source(cell), cell.get("metadata", {})) for cell in nb.cells
    ]
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def cell_source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def strip_outputs(cell):
    if cell.get("cell_type") == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
