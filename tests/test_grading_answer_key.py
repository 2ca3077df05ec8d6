"""The answer key stays with the instructor: the package a student installs holds no reference and
no solution body, and the student's check cells and widgets work from recorded data instead."""

import json
import re
import textwrap
from pathlib import Path

import pytest

from memwall.grading import answer_key
from memwall.grading.cells import BEGIN_SOLUTION, END_SOLUTION
from memwall.grading.checking import check
from memwall.grading.copied import copied_flags, fingerprints, key_fingerprints
from memwall.grading.expected import load_expected
from memwall.grading.sync import notebooks_in, read_notebook
from memwall.widgets.recorded import CURVES_DIR, recorded_curves

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "memwall"
KEY = REPO / "solutions" / "checks"


def package_texts():
    """Every file the wheel ships (the package's sources and data)."""
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json", ".js", ".txt", ".c", ".h"):
            yield path, path.read_text(errors="replace")


def solution_bodies():
    for path in notebooks_in(REPO / "solutions"):
        for cell in read_notebook(path).cells:
            pattern = re.escape(BEGIN_SOLUTION) + r"\n(.*?)\n\s*" + re.escape(END_SOLUTION)
            for body in re.findall(pattern, cell.source, re.S):
                yield path.stem, textwrap.dedent(body).strip()


@pytest.fixture
def student_install(tmp_path, monkeypatch):
    """A working folder with no key above it, as in a student's install."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(answer_key.KEY_VARIABLE, raising=False)
    monkeypatch.setattr(answer_key, "_chosen", None)
    monkeypatch.setattr("memwall.grading.registry._REGISTRY", {})
    assert answer_key.key_folder() is None


def test_the_package_holds_no_reference_and_no_solution_body():
    texts = dict(package_texts())
    assert not [p for p, t in texts.items() if re.search(r"^def reference_\w+\(", t, re.M)]
    assert not (PACKAGE / "grading" / "checks").exists()
    long_bodies = [(stem, body) for stem, body in solution_bodies() if len(body) > 60]
    assert len(long_bodies) >= 9
    for stem, body in long_bodies:
        leaked = [p for p, t in texts.items() if body in t]
        assert not leaked, f"{stem}'s solution body is in {leaked}"


def test_the_package_holds_no_key_function_by_shape():
    key_prints = key_fingerprints(KEY)
    assert key_prints, "the key's reference functions are long enough to fingerprint"
    for path, text in package_texts():
        if path.suffix == ".py":
            assert not set(fingerprints(text)) & set(key_prints), path


def test_a_check_cell_without_the_key_replays_practice_cases(student_install, capsys):
    def time_per_output_token(token_times_s):
        return (token_times_s[-1] - token_times_s[0]) / (len(token_times_s) - 1)

    check("ch01.tpot", time_per_output_token)
    assert "practice cases passed" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="wrong answer"):
        check("ch01.tpot", lambda token_times_s: token_times_s[-1] / len(token_times_s))
    with pytest.raises(AssertionError, match="not implemented yet"):
        check("ch01.tpot", lambda token_times_s: (_ for _ in ()).throw(NotImplementedError("x")))


def test_a_measured_check_replays_on_a_fake_clock_without_the_key(student_install, capsys):
    assert load_expected("ch09.warmup_steps"), "measured checks record practice cases too"


def test_recorded_curves_cover_every_student_widget():
    cells = []
    for path in sorted((REPO / "exercises").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            assert "key_module" not in source and "answer_key" not in source, path
            cells += re.findall(r'recorded_curves\("([\w-]+)", "(\w+)"\)', source)
    assert len(cells) >= 20
    for cell_id, notebook in cells:
        curves = recorded_curves(cell_id, notebook)
        x_name, x_values = curves.x
        values = [curves(**{x_name: x, **curves.start, **curves.fixed}) for x in x_values]
        assert any(v is not None for v in values), (notebook, cell_id)
    assert sorted(p.name for p in CURVES_DIR.glob("*.json"))


def test_a_renamed_copy_of_a_reference_is_flagged_and_an_own_answer_is_not():
    key_prints = key_fingerprints(KEY)
    reference = (KEY / "ch06.py").read_text()
    start = reference.index("def reference_block_tables")
    end = reference.index("\n\n\n", start)
    copied = reference[start:end]
    for old, new in (("free", "spare"), ("tables", "owned"), ("lengths", "sizes")):
        copied = copied.replace(old, new)
    copied = copied.replace("def reference_block_owned", "def block_tables")
    assert copied_flags([copied], key_prints) == [
        "block_tables matches the answer key's ch06.reference_block_tables"
    ]
    own = textwrap.dedent("""
        def block_tables(events, n_blocks, block_size):
            available = list(range(n_blocks))
            owned, sizes = {}, {}
            for kind, seq, *rest in events:
                if kind == "free":
                    available = sorted(available + owned.pop(seq))
                    sizes.pop(seq)
                    continue
                sizes[seq] = sizes.get(seq, 0) + rest[0]
                blocks = owned.setdefault(seq, [])
                need = -(-sizes[seq] // block_size) - len(blocks)
                for _ in range(need):
                    blocks.append(available.pop(0))
            return owned
    """)
    assert copied_flags([own], key_prints) == []
    pasted = "def tpot(times):\n    ### BEGIN SOLUTION\n    return times[1] - times[0]\n"
    assert copied_flags([pasted], key_prints) == [
        "holds the solution notebooks' marker '### BEGIN SOLUTION'"
    ]


def test_hints_name_the_idea_not_the_finished_expression():
    from memwall.grading.cells import exercise_hint, exercise_id

    hints = [
        exercise_hint(cell)
        for path in notebooks_in(REPO / "solutions")
        for cell in read_notebook(path).cells
        if exercise_id(cell)
    ]
    assert len(hints) >= 27
    formula = re.compile(r"[=*/^<>+]|\b(max|min|sum|ceil|median)\s*\(|\bx\b")
    assert not [hint for hint in hints if formula.search(hint)]


def solution_namespaces():
    """For each real chapter: its solution's import and exercise cells run, and its check cells."""
    from memwall.widgets.recording import _runs_while_recording

    for path in notebooks_in(REPO / "solutions"):
        cells = [cell for cell in read_notebook(path).cells if cell.cell_type == "code"]
        runnable = [c for c in cells if _runs_while_recording(c, c.source)]
        checks = [c.source for c in cells if "check" in c.metadata.get("memwall", {})]
        yield path.stem, [c.source for c in runnable if "compare_plot(" not in c.source], checks


@pytest.mark.parametrize("stem, exercises, checks", list(solution_namespaces()),
                         ids=lambda v: v if isinstance(v, str) else "")  # fmt: skip
def test_every_solution_passes_its_practice_cases_without_the_key(
    stem, exercises, checks, student_install, capsys
):
    namespace = {}
    for source in exercises:
        exec(compile(source, stem, "exec"), namespace)  # noqa: S102 (our own solutions)
    for source in checks:
        exec(compile(source, stem, "exec"), namespace)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(checks) >= 3
    passed = [line for line in lines if "practice cases passed" in line]
    assert len(passed) >= len(lines) - 1, lines  # at most one check without practice cases
    assert all(line in passed or "no practice cases here" in line for line in lines), lines


def test_the_grader_flags_a_pasted_solution_body_with_renamed_variables():
    from memwall.grading.grader import SolutionBook

    book = SolutionBook(REPO / "solutions")
    book.find_key()
    body = next(b for stem, b in solution_bodies() if stem == "06_batching" and "min(free)" in b)
    pasted = "def block_tables(events, n_blocks, block_size):\n" + textwrap.indent(
        body.replace("free", "spare").replace("lengths", "sizes"), "    "
    )
    assert "block_tables matches the answer key's" in " ".join(
        copied_flags([pasted], book.key_prints())
    )


def test_the_instructors_guide_names_checks_and_key_functions_that_exist():
    guide = (REPO / "book" / "instructors.md").read_text()
    named = set(re.findall(r"\b(ch\d\d)\.([a-z_]+)\b", guide))
    missing = []
    for chapter, name in named:
        solution = list((REPO / "solutions").glob(f"{chapter[2:]}_*.md"))
        if not solution:  # the guide's worked example of a new chapter (ch10)
            continue
        key = (KEY / f"{chapter}.py").read_text()
        if f'check("{chapter}.{name}"' not in solution[0].read_text() and f"def {name}(" not in key:
            missing.append(f"{chapter}.{name}")
    assert named and not missing, missing
