"""Rebuild a submission on the solution's skeleton, so that tampering gains nothing.

The notebook the grader runs is the solution notebook with each exercise cell's source swapped
for the student's own. Every other cell (setup, widgets, and above all the check cells) comes
from the solution, whatever the student did to it: edited, deleted, moved or duplicated.

A student's cells are recognised, in order of preference, by memwall metadata, by cell id, by
a ``check("name"`` call, or by the exercise cell's first line (for editors that drop metadata).
Code cells the student added are kept, right after the exercise cell they follow (or before
the first exercise), so helper functions still work; added markdown is dropped. An exercise
cell that is missing is left out: its check then fails unless the student's added code defines
what it needs.
"""

import re
from collections import defaultdict
from dataclasses import dataclass, field

import nbformat

from memwall.grading.cells import check_name, exercise_id
from memwall.grading.student_copy import cell_source, strip_outputs


@dataclass
class Restored:
    nb: object
    matched_exercises: int
    notes: list = field(default_factory=list)
    # Everything the student wrote that will run, for the tampering scan.
    student_sources: list = field(default_factory=list)


def restore_submission(solution_nb, submission_nb) -> Restored:
    """The notebook to grade: the solution's cells, with the student's exercise code."""
    layout = _SolutionLayout(solution_nb)
    answers, extras, seen_checks, order = defaultdict(list), defaultdict(list), {}, []
    anchor = None  # the exercise the student's added cells follow
    student_code_cells = [cell for cell in submission_nb.cells if cell.get("cell_type") == "code"]
    # Exercises found by metadata or id are never claimed by the weaker first-line match.
    identified = {layout.identify_exercise(cell) for cell in student_code_cells}
    for cell in student_code_cells:
        source = cell_source(cell)
        kind, name = layout.classify(cell, source, taken=identified | set(answers))
        if kind == "exercise":
            answers[name].append(source)
            anchor = name
        elif kind == "check":
            seen_checks.setdefault(name, source)
        elif kind == "added":
            extras[anchor].append(source)
        if kind in ("exercise", "check"):
            order.append((kind, name))
    restored = Restored(nb=_rebuild(solution_nb, answers, extras), matched_exercises=len(answers))
    restored.notes = _notes(layout, answers, seen_checks, order)
    restored.student_sources = [s for sources in answers.values() for s in sources]
    restored.student_sources += [s for sources in extras.values() for s in sources]
    return restored


class _SolutionLayout:
    """What the solution notebook looks like, for recognising a student's cells."""

    def __init__(self, solution_nb):
        self.exercises, self.checks, self.order = [], {}, []
        self.exercise_by_cell_id, self.check_by_cell_id, self.exercise_by_first_line = {}, {}, {}
        self.original_ids, self.original_sources = set(), set()
        for cell in solution_nb.cells:
            source = cell_source(cell)
            self.original_ids.add(cell.get("id"))
            self.original_sources.add(source.strip())
            ex_id, name = exercise_id(cell), check_name(cell)
            if ex_id is not None:
                self.exercises.append(ex_id)
                self.order.append(("exercise", ex_id))
                self.exercise_by_cell_id[cell.get("id")] = ex_id
                self.exercise_by_first_line[first_line(source)] = ex_id
            if name is not None:
                self.checks[name] = source
                self.order.append(("check", name))
                self.check_by_cell_id[cell.get("id")] = name
        self.original_ids.discard(None)
        self.exercise_by_first_line.pop("", None)

    def identify_exercise(self, cell):
        """The exercise a cell answers, by its metadata or its cell id, or None."""
        ex_id = exercise_id(cell)
        if ex_id in self.exercises:
            return ex_id
        if check_name(cell) is None:
            return self.exercise_by_cell_id.get(cell.get("id"))
        return None

    def classify(self, cell, source, taken):
        """('exercise' | 'check' | 'original' | 'added', name) for one of the student's code cells."""
        ex_id, name = self.identify_exercise(cell), check_name(cell)
        if ex_id is not None:
            return "exercise", ex_id
        if name in self.checks:
            return "check", name
        cell_id = cell.get("id")
        if cell_id in self.check_by_cell_id:
            return "check", self.check_by_cell_id[cell_id]
        for check in self.checks:
            if re.search(rf"""\bcheck\(\s*["']{re.escape(check)}["']""", source):
                return "check", check
        by_line = self.exercise_by_first_line.get(first_line(source))
        if by_line is not None and by_line not in taken:
            return "exercise", by_line
        if (
            cell_id in self.original_ids
            or source.strip() in self.original_sources
            or not source.strip()
        ):
            return "original", None
        return "added", None


def _rebuild(solution_nb, answers, extras):
    rebuilt = nbformat.from_dict(solution_nb)
    cells, first_exercise = [], True
    for cell in rebuilt.cells:
        strip_outputs(cell)
        ex_id = exercise_id(cell)
        if ex_id is None:
            cells.append(cell)
            continue
        if first_exercise:
            cells += [nbformat.v4.new_code_cell(source) for source in extras[None]]
            first_exercise = False
        for number, source in enumerate(answers.get(ex_id, [])):
            # The first copy keeps the solution cell's id and metadata; duplicates get new ids.
            answer = (
                nbformat.from_dict(cell)
                if number == 0
                else nbformat.v4.new_code_cell(metadata=cell.metadata)
            )
            answer["source"] = source
            cells.append(answer)
        cells += [nbformat.v4.new_code_cell(source) for source in extras[ex_id]]
    if first_exercise:
        cells += [nbformat.v4.new_code_cell(source) for source in extras[None]]
    rebuilt.cells = cells
    return rebuilt


def _notes(layout, answers, seen_checks, order):
    notes = []
    edited = sum(
        1 for name, source in seen_checks.items() if source.strip() != layout.checks[name].strip()
    )
    missing_checks = sum(1 for name in layout.checks if name not in seen_checks)
    if edited:
        notes.append(f"restored {edited} edited check cell{'s' * (edited > 1)}")
    if missing_checks:
        notes.append(f"restored {missing_checks} missing check cell{'s' * (missing_checks > 1)}")
    present = [item for item in layout.order if item in order]
    if _first_occurrences(order) != present:
        notes.append("restored cell order")
    missing = [ex_id for ex_id in layout.exercises if ex_id not in answers]
    if missing:
        notes.append(f"exercise cell missing: {', '.join(missing)}")
    return notes


def _first_occurrences(items):
    seen, unique = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique


def first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip():
            return line.strip()
    return ""
