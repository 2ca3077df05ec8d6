"""The grading package piece by piece, without starting a kernel."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from memwall.grading import (
    check,
    compare_function,
    compare_value,
    make_student_copy,
    validate_solution,
)
from memwall.grading.cells import check_cells
from memwall.grading.execute import CellOutcome, fatal_cell
from memwall.grading.grader import explain_failure, read_submission
from memwall.grading.registry import get_check
from memwall.grading.restore import restore_submission
from memwall.grading.student_copy import blank_solution_spans
from memwall.grading.submissions import find_submissions
from memwall.grading.sync import notebook_signature, sync_exercises
from memwall.grading.tampering import tampering_flags

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
SOLUTION = FIXTURES / "solutions" / "00_demo.ipynb"


def solution():
    return nbformat.read(str(SOLUTION), as_version=4)


def code_cell(source, cell_id=None, **memwall):
    cell = nbformat.v4.new_code_cell(source, metadata={"memwall": memwall} if memwall else {})
    if cell_id:
        cell["id"] = cell_id
    return cell


# ---- the student copy ------------------------------------------------------------------------


def test_solution_span_becomes_one_raise_at_the_marker_indentation():
    source = (
        "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n"
    )
    assert blank_solution_spans(source, "Exercise 1: add") == (
        'def f(x):\n    y = 1\n    raise NotImplementedError("Exercise 1: add")\n'
    )


def test_top_level_spans_and_several_spans_per_cell():
    source = "### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n  ### BEGIN SOLUTION\n  c\n  ### END SOLUTION"
    blanked = blank_solution_spans(source, 'say "hi"')
    assert (
        blanked
        == 'raise NotImplementedError("say \\"hi\\"")\nb = 2\n  raise NotImplementedError("say \\"hi\\"")'
    )


@pytest.mark.parametrize(
    "source",
    ["### BEGIN SOLUTION\nx", "x\n### END SOLUTION", "### BEGIN SOLUTION\n### BEGIN SOLUTION"],
)
def test_unbalanced_markers_are_an_error(source):
    with pytest.raises(ValueError):
        blank_solution_spans(source, "")


def test_student_copy_numbers_exercises_strips_outputs_and_records_its_source():
    nb = solution()
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="leak")]
    copy = make_student_copy(nb, "00_demo.ipynb")
    sources = [cell.source for cell in copy.cells if cell.cell_type == "code"]
    assert "raise NotImplementedError(" in sources[0] and '"Exercise 1: rows x cols' in sources[0]
    assert 'raise NotImplementedError("Exercise 3: one full read' in sources[-2]
    assert all(not cell.get("outputs") for cell in copy.cells)
    assert copy.metadata["memwall"]["generated_from"] == "00_demo.ipynb"
    assert len(copy.metadata["memwall"]["solution_sha256"]) == 64
    assert [cell.id for cell in copy.cells] == [cell.id for cell in nb.cells]
    assert nb.cells[2].outputs, "the solution itself is left alone"
    compile("\n".join(sources), "student copy", "exec")  # still valid Python


def test_student_copy_hash_follows_the_solution():
    nb = solution()
    before = make_student_copy(nb).metadata["memwall"]["solution_sha256"]
    nb.cells[2].source = nb.cells[2].source.replace("rows * cols", "cols * rows")
    assert make_student_copy(nb).metadata["memwall"]["solution_sha256"] != before


def test_sync_writes_then_reports_in_sync_then_spots_an_edit(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    (solutions / "00_demo.ipynb").write_bytes(SOLUTION.read_bytes())
    assert sync_exercises(solutions, exercises, check=True) != []
    assert not exercises.exists(), "--check changes nothing"
    assert len(sync_exercises(solutions, exercises)) == 1
    assert sync_exercises(solutions, exercises, check=True) == []
    student = nbformat.read(str(exercises / "00_demo.ipynb"), as_version=4)
    student.cells[3].source += "\n# hand edit"
    nbformat.write(student, str(exercises / "00_demo.ipynb"))
    (exercises / "99_gone.ipynb").write_text(json.dumps(make_student_copy(solution())))
    problems = sync_exercises(solutions, exercises, check=True)
    assert len(problems) == 2 and "differs" in problems[0] and "no solution" in problems[1]
    sync_exercises(solutions, exercises)
    assert sync_exercises(solutions, exercises, check=True) == []
    assert not (exercises / "99_gone.ipynb").exists()


def test_sync_checks_the_practice_cases_the_student_copies_read(tmp_path, monkeypatch):
    from memwall.grading import sync

    # practice cases the key would now record differently (a check was changed)
    stale = {"memwall/grading/expected/ch04.json": "{}\n"}
    monkeypatch.setattr(sync, "practice_data", lambda key: stale)
    (problem,) = sync_exercises(tmp_path / "none", tmp_path / "exercises", check=True)
    assert problem.endswith("memwall/grading/expected/ch04.json: out of date")


def test_signature_ignores_outputs():
    nb = solution()
    before = notebook_signature(nb)
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", text="x")]
    assert notebook_signature(nb) == before


# ---- format validation -----------------------------------------------------------------------


def test_the_fixture_follows_the_format():
    assert validate_solution(solution()) == []


def test_validation_catches_the_classic_mistakes():
    nb = solution()
    check_cell = next(cell for cell in nb.cells if cell.id == "ex1-check")
    check_cell.metadata["tags"] = ["raises-exception"]
    check_cell.source = 'check("demo.matrix_bytes", matrix_bytes)'
    check_cell.metadata["memwall"]["points"] = 0
    nb.cells.append(code_cell("### BEGIN SOLUTION\nx = 1", cell_id="stray"))
    nb.cells.append(
        code_cell(
            'from memwall.grading import check\ncheck("demo.nope", 1)',
            cell_id="c9",
            check="demo.nope",
            points=1,
        )
    )
    problems = "\n".join(validate_solution(nb))
    for expected in ("raises-exception", "from memwall.grading import check", "positive 'points'",
                     "no metadata", "no check named 'demo.nope'"):  # fmt: skip
        assert expected in problems


def test_a_chapter_needs_three_checks():
    nb = solution()
    nb.cells = [cell for cell in nb.cells if cell.get("id") != "ex3-check"]
    assert any("at least 3" in problem for problem in validate_solution(nb))


# ---- checks and comparisons ------------------------------------------------------------------


def test_check_prints_one_line_on_success(capsys):
    check(
        "demo.matrix_bytes", lambda rows, cols, bytes_per_element: rows * cols * bytes_per_element
    )
    assert capsys.readouterr().out == "✓ demo.matrix_bytes: 12/12 cases passed\n"


def test_check_names_the_failing_input_expected_and_got():
    with pytest.raises(AssertionError) as failure:
        check(
            "demo.matrix_bytes",
            lambda rows, cols, bytes_per_element: rows * cols * bytes_per_element + 1,
        )
    message = str(failure.value)
    assert message.startswith("demo.matrix_bytes: wrong answer for <lambda>(rows=")
    assert "expected" in message and "got" in message and "(case 1 of 12)" in message


def test_unfinished_exercise_is_not_implemented_yet():
    def matrix_bytes(rows, cols, bytes_per_element):
        raise NotImplementedError("Exercise 1: hint")

    with pytest.raises(
        AssertionError, match=r"demo.matrix_bytes: not implemented yet \(Exercise 1: hint\)"
    ):
        check("demo.matrix_bytes", matrix_bytes)


def test_hidden_cases_change_between_runs_unless_the_seed_is_pinned(monkeypatch):
    seen = []
    spy = lambda rows, cols, bytes_per_element: seen.append(rows) or rows * cols * bytes_per_element  # noqa: E731
    check("demo.matrix_bytes", spy)
    check("demo.matrix_bytes", spy)
    assert seen[:12] != seen[12:]
    monkeypatch.setenv("MEMWALL_CHECK_SEED", "7")
    seen.clear()
    check("demo.matrix_bytes", spy)
    check("demo.matrix_bytes", spy)
    assert seen[:12] == seen[12:]


def test_every_demo_check_rejects_its_wrong_answers():
    for _, name, _ in check_cells(solution()):
        for wrong in get_check(name).wrong_answers:
            with pytest.raises(AssertionError, match="wrong answer"):
                check(name, wrong)


def test_unknown_checks_say_what_exists():
    with pytest.raises(LookupError, match="no check module ch99.py"):
        get_check("ch99.anything")
    with pytest.raises(LookupError, match="demo.matrix_bytes"):
        get_check("demo.typo")


def test_compare_function_messages():
    def reference(x):
        return [x, 2 * x]

    assert compare_function(lambda x: [x, 2.0 * x], reference, [1, 2, 3]) == 3
    with pytest.raises(AssertionError, match=r"\[1\]: expected 4, got 5"):
        compare_function(lambda x: [x, 2 * x + 1], reference, [2])
    with pytest.raises(AssertionError, match="expected a list of 2 items, got int"):
        compare_function(lambda x: x, reference, [2])
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        compare_function(lambda x: 1 / 0, reference, [2])
    with pytest.raises(AssertionError, match="expected a function, got int"):
        compare_function(3, reference, [2])


def test_compare_function_passes_copies_and_keyword_cases():
    def mutating(values):
        values.append(0)
        return len(values)

    assert compare_function(mutating, lambda values: len(values) + 1, [dict(values=[1, 2])]) == 1


def test_compare_value_with_tolerance_and_arrays():
    import numpy as np

    assert compare_value(1.0 + 1e-9, 1.0) == 1
    with pytest.raises(AssertionError, match="your answer is wrong: expected 2, got 3"):
        compare_value(3, 2)
    with pytest.raises(AssertionError, match="expected shape"):
        compare_value(np.zeros(3), np.zeros(4))
    with pytest.raises(AssertionError, match="arrays differ"):
        compare_value(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    with pytest.raises(AssertionError, match="expected True"):
        compare_value(1, True)


# ---- submissions, restore and scoring --------------------------------------------------------


def test_both_submission_layouts(tmp_path):
    (tmp_path / "alice__01_two_phases.ipynb").write_text("{}")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "01_two_phases.ipynb").write_text("{}")
    (tmp_path / "carol_01.ipynb").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    found, skipped = find_submissions(tmp_path)
    assert [(s.student, s.chapter) for s in found] == [
        ("alice", "01_two_phases"),
        ("bob", "01_two_phases"),
        ("carol_01", ""),
    ]
    assert [path.name for path in skipped] == ["notes.txt"]
    assert found[0].feedback_name == "alice__01_two_phases.txt"


@pytest.mark.parametrize(
    "content, problem",
    [(b"", "empty file"), (b"\x89PNG", "not JSON"), (b"[1, 2]", "not a notebook"),
     (json.dumps(nbformat.v4.new_notebook()).encode(), "empty notebook")],
)  # fmt: skip
def test_unreadable_submissions_say_why(tmp_path, content, problem):
    path = tmp_path / "x.ipynb"
    path.write_bytes(content)
    assert read_submission(path) == (None, problem)


def test_restore_puts_the_solution_check_cells_back_around_student_code():
    student = make_student_copy(solution())
    for cell in student.cells:
        if cell.get("id") == "ex1":
            cell.source = "def matrix_bytes(r, c, b):\n    return r * c * b"
        if cell.get("id") == "ex1-check":
            cell.source = "pass"
    helper = code_cell("def helper():\n    return 1")
    student.cells.insert(3, helper)
    student.cells.append(nbformat.v4.new_markdown_cell("my notes"))
    restored = restore_submission(solution(), student)
    sources = [cell.source for cell in restored.nb.cells if cell.cell_type == "code"]
    assert sources[0] == "def matrix_bytes(r, c, b):\n    return r * c * b"
    assert sources[1] == "def helper():\n    return 1"
    assert (
        sources[2] == 'from memwall.grading import check\ncheck("demo.matrix_bytes", matrix_bytes)'
    )
    assert restored.notes == ["restored 1 edited check cell"]
    assert restored.matched_exercises == 3
    assert [c.source for c in restored.nb.cells if c.cell_type == "markdown"] == [
        c.source for c in solution().cells if c.cell_type == "markdown"
    ]


def test_tampering_flags():
    assert tampering_flags(["x = 1", "def f():\n    return 2"]) == []
    assert tampering_flags(["import memwall.grading as g"]) == ["touches memwall.grading"]
    assert tampering_flags(["check = print"]) == ["redefines check"]
    assert tampering_flags(["checked = 1", "if check == 2: pass"]) == []
    assert tampering_flags(["import builtins"]) == ["patches imports"]
    assert tampering_flags(["exec(payload)"]) == ["runs generated code"]


def test_fatal_cell_is_the_one_before_the_kernel_was_found_dead():
    cells = {
        0: CellOutcome(0, True),
        1: CellOutcome(1, False, message="Timeout of 5 seconds exceeded while executing cell."),
        2: CellOutcome(2, False, message="Kernel dead on test start"),
        3: CellOutcome(3, False, message="Kernel dead on test start"),
    }
    assert fatal_cell(cells) == 1
    assert fatal_cell({0: CellOutcome(0, True)}) is None


def test_failure_explanations():
    assert (
        explain_failure(CellOutcome(0, False, error="AssertionError: demo.x: wrong"))
        == "demo.x: wrong"
    )
    assert explain_failure(
        CellOutcome(0, False, error="NameError: name 'f' is not defined")
    ).startswith("not implemented yet")
    assert "endless loop" in explain_failure(
        CellOutcome(0, False, message="Timeout of 5 seconds exceeded executing cell")
    )
    assert "kernel died" in explain_failure(CellOutcome(0, False, kernel_exit=0))


def test_exercises_command_check_mode_exit_codes(tmp_path):
    solutions = tmp_path / "solutions"
    solutions.mkdir()
    (solutions / "00_demo.ipynb").write_bytes(SOLUTION.read_bytes())

    def run(*args):
        command = [sys.executable, "-m", "memwall.grading", "exercises", "--solutions", str(solutions),
                   "--exercises", str(tmp_path / "exercises"), *args]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    out_of_sync = run("--check")
    assert out_of_sync.returncode == 1 and "out of sync" in out_of_sync.stdout
    assert run().returncode == 0
    in_sync = run("--check")
    assert in_sync.returncode == 0 and "in sync" in in_sync.stdout


def test_a_long_hint_is_wrapped_to_the_page_and_keeps_every_word():
    from memwall.grading.student_copy import PAGE_COLUMNS, not_implemented

    message = "Exercise 3: " + " ".join(f"word{i}" for i in range(40))
    code = "def f():\n" + not_implemented("    ", message)
    assert all(len(line) <= PAGE_COLUMNS for line in code.splitlines())
    namespace = {}
    exec(code, namespace)  # noqa: S102 (generated from our own message)
    with pytest.raises(NotImplementedError) as raised:
        namespace["f"]()
    assert str(raised.value) == message
