"""exercises/ is generated from solutions/ and must stay in step with it.

Runs over the repository's solutions/ and over the grader's fixture (so the machinery is tested
even while solutions/ is empty). The fast tests read notebooks only; the slow one runs each real
chapter's solution (full marks) and its blank copy (every check fails) through the grader.
"""

from pathlib import Path

import nbformat
import pytest

from memwall.grading import check, get_check, grade, validate_solution
from memwall.grading.cells import BEGIN_SOLUTION, check_cells, check_name
from memwall.grading.sync import notebook_signature, notebooks_in, read_notebook, sync_exercises
from memwall.notebooks import student_copy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "grading"
FOLDER_PAIRS = {
    "repo": (REPO / "solutions", REPO / "exercises"),
    "fixture": (FIXTURES / "solutions", FIXTURES / "exercises"),
}
SOLUTION_PATHS = [
    path for solutions, _ in FOLDER_PAIRS.values() for path in notebooks_in(solutions)
]
CHAPTER_SOLUTIONS = notebooks_in(REPO / "solutions")


def exercise_path(solution_path: Path) -> Path:
    return solution_path.parent.parent / "exercises" / f"{solution_path.stem}.ipynb"


def label(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("pair", FOLDER_PAIRS, ids=str)
def test_committed_exercises_are_in_sync(pair):
    solutions, exercises = FOLDER_PAIRS[pair]
    assert sync_exercises(solutions, exercises, check=True) == [], (
        "run `memwall exercises` and commit exercises/"
    )


@pytest.mark.parametrize("solution_path", SOLUTION_PATHS, ids=label)
def test_generated_copy_equals_committed_copy(solution_path):
    generated, _ = student_copy(solution_path, read_notebook(solution_path))
    committed = read_notebook(exercise_path(solution_path))
    assert notebook_signature(committed) == notebook_signature(generated)


@pytest.mark.parametrize("solution_path", SOLUTION_PATHS, ids=label)
def test_exercises_hide_solutions_and_keep_check_cells(solution_path):
    solution = read_notebook(solution_path)
    exercise = read_notebook(exercise_path(solution_path))
    assert not any(BEGIN_SOLUTION in cell.source for cell in exercise.cells)

    def check_cell_contents(nb):
        return [(cell.source, cell.metadata) for cell in nb.cells if check_name(cell)]

    assert check_cell_contents(exercise) == check_cell_contents(solution)


@pytest.mark.parametrize("solution_path", SOLUTION_PATHS, ids=label)
def test_solution_follows_the_exercise_format(solution_path):
    nb = read_notebook(solution_path)
    assert validate_solution(nb) == []
    assert len(check_cells(nb)) >= 3 and all(points > 0 for _, _, points in check_cells(nb))


def _unfinished(*args, **kwargs):
    raise NotImplementedError("Exercise: unfinished")


@pytest.mark.parametrize("solution_path", SOLUTION_PATHS, ids=label)
def test_every_check_rejects_known_wrong_and_unfinished_answers(solution_path):
    for _, name, _ in check_cells(read_notebook(solution_path)):
        spec = get_check(name)
        assert spec.wrong_answers, (
            f"register {name!r} with wrong_answers=[...] so CI can prove it rejects them"
        )
        for wrong in spec.wrong_answers:
            with pytest.raises(AssertionError):
                check(name, wrong)
        with pytest.raises(AssertionError):
            check(name, _unfinished)


@pytest.mark.slow
@pytest.mark.parametrize("solution_path", CHAPTER_SOLUTIONS, ids=label)
def test_solution_scores_full_marks_and_blank_copy_scores_nothing(solution_path, tmp_path):
    submissions = tmp_path / "submissions"
    submissions.mkdir()
    chapter = solution_path.stem
    solved = nbformat.writes(read_notebook(solution_path))  # the source may be MyST Markdown
    (submissions / f"solution__{chapter}.ipynb").write_text(solved)
    (submissions / f"blank__{chapter}.ipynb").write_bytes(exercise_path(solution_path).read_bytes())
    rows = grade(
        submissions,
        tmp_path / "grades.csv",
        jobs=2,
        solutions_dir=solution_path.parent,
        progress=False,
    )
    by_student = {row.student: row for row in rows}
    solved, blank = by_student["solution"], by_student["blank"]
    # The solution itself is the key's code, with the key's markers, so the copied-code flags
    # may name it; nothing else.
    copied = ("matches the answer key", "holds the solution notebooks' marker")
    notes = [note for note in solved.status.split("; ") if not any(c in note for c in copied)]
    assert (notes or ["ok"], solved.total) == (["ok"], solved.max_points), [
        c.message for c in solved.checks
    ]
    assert blank.status == "ok" and blank.total == 0
    assert all(result.message != "not run" for result in blank.checks)
