"""Lint a solution notebook against the exercise format, before it is handed out.

Each problem is reported as one sentence that names the cell, so `memwall exercises` and the
sync test can say what to fix.
"""

import re

from memwall.grading.cells import (
    BEGIN_SOLUTION,
    EXERCISE_ID,
    check_name,
    check_points,
    exercise_id,
    has_solution_markers,
)
from memwall.grading.student_copy import blank_solution_spans, cell_source

MIN_CHECKS_PER_CHAPTER = 3


def validate_solution(nb, min_checks=MIN_CHECKS_PER_CHAPTER, resolve_checks=True) -> list:
    """Return a list of problems with ``nb`` (empty when it follows the format)."""
    problems = []
    seen_exercises, seen_checks = set(), set()
    for index, cell in enumerate(nb.cells):
        where = f"cell {index}"
        source = cell_source(cell)
        if "id" not in cell:
            problems.append(f"{where}: has no cell id (save the notebook as nbformat 4.5 or later)")
        ex_id, name = exercise_id(cell), check_name(cell)
        if has_solution_markers(source) or ex_id is not None:
            problems += _exercise_cell_problems(where, cell, source, ex_id, seen_exercises)
        if name is not None:
            problems += _check_cell_problems(where, cell, source, name, seen_checks, resolve_checks)
    if len(seen_checks) < min_checks:
        problems.append(
            f"has {len(seen_checks)} check cells; every chapter needs at least {min_checks}"
        )
    return problems


def _exercise_cell_problems(where, cell, source, ex_id, seen):
    problems = []
    if cell.get("cell_type") != "code":
        return [f"{where}: {BEGIN_SOLUTION} is only allowed in code cells"]
    if ex_id is None:
        problems.append(
            f'{where}: has solution markers but no metadata {{"memwall": {{"solution": "<id>"}}}}'
        )
    elif ex_id in seen:
        problems.append(f"{where}: exercise id {ex_id!r} is used by two cells")
    else:
        seen.add(ex_id)
    if not has_solution_markers(source):
        problems.append(f"{where}: is marked as exercise {ex_id!r} but has no {BEGIN_SOLUTION}")
    try:
        blank_solution_spans(source, "")
    except ValueError as error:
        problems.append(f"{where}: {str(error).splitlines()[0]}")
    return problems


def _check_cell_problems(where, cell, source, name, seen, resolve_checks):
    problems = []
    if not EXERCISE_ID.match(name):
        problems.append(f"{where}: check name {name!r} must look like 'ch01.some_name'")
    if name in seen:
        problems.append(f"{where}: check {name!r} appears twice")
    seen.add(name)
    if check_points(cell) <= 0:
        problems.append(f"{where}: check {name!r} needs positive 'points' in its metadata")
    tags = cell.get("metadata", {}).get("tags", [])
    if "raises-exception" in tags or "NBVAL_RAISES_EXCEPTION" in source:
        # nbval would then pass a blank exercise.
        problems.append(f"{where}: check cell {name!r} must not be tagged raises-exception")
    if has_solution_markers(source):
        problems.append(f"{where}: a check cell must not contain solution markers")
    # The cell imports `check` itself, so a student's own `check = ...` is overridden.
    if not re.search(r"^from memwall\.grading import check\s*$", source, re.MULTILINE):
        problems.append(
            f"{where}: check cell must contain the line 'from memwall.grading import check'"
        )
    if not re.search(rf"""\bcheck\(\s*["']{re.escape(name)}["']""", source):
        problems.append(f"{where}: check cell must call check({name!r}, ...)")
    if resolve_checks:
        from memwall.grading.registry import get_check

        try:
            get_check(name)
        except LookupError as error:
            problems.append(f"{where}: {error}")
    return problems
