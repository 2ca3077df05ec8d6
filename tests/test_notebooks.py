"""The MyST sources are the only hand-edited notebooks; everything committed beside them is generated.

The drift test regenerates every notebook in a temporary copy of the sources and requires the
committed files to be byte-identical: edit chapters/*.md or solutions/*.md, then `make notebooks`.
"""

import ast
import builtins
import contextlib
import importlib
import io
import shutil
from pathlib import Path

import nbformat
import pytest

from memwall.grading.cells import check_name, exercise_id
from memwall.notebooks import (
    COLAB_CELL_ID,
    generated_notebooks,
    read_source,
    repository_url,
    write_notebooks,
)

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "chapters").glob("*.md")) + sorted((REPO / "solutions").glob("*.md"))


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    copy = tmp_path_factory.mktemp("sources")
    for folder in ("chapters", "solutions"):
        (copy / folder).mkdir()
        for source in (REPO / folder).glob("*.md"):
            shutil.copy(source, copy / folder / source.name)
    shutil.copy(REPO / "_config.yml", copy / "_config.yml")
    written = write_notebooks(copy)
    return copy, written


def test_there_are_sources_for_every_chapter_and_solution():
    assert len(list((REPO / "chapters").glob("*.md"))) == 9
    assert len(list((REPO / "solutions").glob("*.md"))) == 9
    assert not list((REPO / "solutions").glob("*.ipynb")), "solutions/ holds only MyST sources"
    assert not (REPO / "scripts").exists(), "the notebook scripts are gone: edit the .md files"


def test_committed_notebooks_are_what_the_sources_generate(regenerated):
    copy, written = regenerated
    # 9 chapters, 9 student copies, and the data the student copies read instead of the answer
    # key: 9 files of recorded widget curves and 10 of practice cases (the key's demo too).
    assert len(written) == 37, written
    for relative in written:
        committed = REPO / relative
        assert committed.is_file(), f"{relative} is missing: run `make notebooks` and commit it"
        assert committed.read_bytes() == (copy / relative).read_bytes(), (
            f"{relative} differs from its source: run `make notebooks` and commit it"
        )
    generated = {p.relative_to(REPO).as_posix() for p in REPO.glob("chapters/*.ipynb")}
    generated |= {p.relative_to(REPO).as_posix() for p in REPO.glob("exercises/*.ipynb")}
    generated |= {  # the grader's demo fixture records its own curves (`memwall exercises`)
        p.relative_to(REPO).as_posix()
        for p in REPO.glob("memwall/widgets/curves/*")
        if (REPO / "solutions" / f"{p.stem}.md").exists()
    }
    generated |= {p.relative_to(REPO).as_posix() for p in REPO.glob("memwall/grading/expected/*")}
    assert generated == set(written), "a committed notebook has no source (or the reverse)"


def test_generation_is_deterministic_and_a_second_run_changes_nothing(regenerated):
    copy, _ = regenerated
    assert write_notebooks(copy, check=True) == []
    assert generated_notebooks(copy) == generated_notebooks(copy)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cell_ids_are_unique_and_exercise_cells_are_named_after_their_exercise(source):
    nb = read_source(source)
    ids = [cell.id for cell in nb.cells]
    assert len(ids) == len(set(ids))
    assert nb.cells[0].id == COLAB_CELL_ID
    assert repository_url(REPO) in nb.cells[0].source
    for cell in nb.cells:
        if exercise_id(cell):
            assert cell.id == exercise_id(cell).replace(".", "-")
        elif check_name(cell):
            assert cell.id == check_name(cell).replace(".", "-") + "-check"
    nbformat.validate(nb)


CODE_COLUMN_CHARS = 92  # what a code cell shows at the book's width without scrolling


@pytest.mark.parametrize("source", sorted((REPO / "chapters").glob("*.md")), ids=lambda p: p.stem)
def test_chapter_code_fits_the_page_width(source):
    """Every line of a chapter's code cells shows whole on the built page (the Colab cell is
    hidden there)."""
    too_wide = [
        line
        for cell in read_source(source).cells
        if cell.cell_type == "code" and cell.get("id") != COLAB_CELL_ID
        for line in cell.source.splitlines()
        if len(line) > CODE_COLUMN_CHARS
    ]
    assert not too_wide, f"{len(too_wide)} code line(s) over {CODE_COLUMN_CHARS}: {too_wide[:3]}"


# --- Pages a reader can scan (issue 39) -------------------------------------------------------
# A cell tagged hide-input shows its output with its code folded; the code a reader should read
# (the experiment, the calls into memwall) stays visible, the code that only prints it is folded.
PRINT_LINES_SHOWN = 15  # the most lines of print()/display() calls a visible cell may hold
FOLDED_TAGS = {"hide-input", "hide-cell", "remove-input", "remove-cell"}


def output_call_lines(source: str) -> int:
    """How many lines of a cell's code lie inside print() or display() calls."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("print", "display")
        ):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return len(lines)


def cells_shown(source: Path) -> list:
    """The code cells whose code the built page shows (the Colab cell is removed there)."""
    return [
        cell
        for cell in read_source(source).cells
        if cell.cell_type == "code" and not FOLDED_TAGS & set(cell.metadata.get("tags", []))
    ]


def printing_too_much(source: Path, budget: int = PRINT_LINES_SHOWN) -> list[str]:
    return [
        f"{output_call_lines(cell.source)} print lines in the cell starting "
        f"{cell.source.splitlines()[0]!r}"
        for cell in cells_shown(source)
        if output_call_lines(cell.source) > budget
    ]


def test_the_print_budget_counts_print_lines_and_skips_folded_cells(tmp_path):
    source = tmp_path / "chapter.md"
    source.write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n---\n\n"
        '```{code-cell}\nx = 1\nprint(f"{x}"\n      f"{x}")\ndisplay(x)\n```\n\n'
        "```{code-cell}\n:tags: [hide-input]\n\nprint(1)\nprint(2)\nprint(3)\nprint(4)\n```\n"
    )
    shown = cells_shown(source)
    assert [output_call_lines(cell.source) for cell in shown] == [3]
    assert printing_too_much(source, budget=3) == []
    assert printing_too_much(source, budget=2) == ["3 print lines in the cell starting 'x = 1'"]


@pytest.mark.parametrize("source", sorted((REPO / "chapters").glob("*.md")), ids=lambda p: p.stem)
def test_code_that_only_prints_results_is_folded(source):
    """A page shows the code that computes and folds the code that only formats the output.

    The rule: a code cell left visible holds at most PRINT_LINES_SHOWN lines of print() and
    display() calls (the lines their arguments span: tables, verdict strings). A longer
    printing tail goes into a cell of its own tagged `hide-input`, right after the cell that
    computes what it prints, so nothing runs in another order and the outputs stay where
    they were. Before issue 39 no cell was folded and single cells printed up to 46 lines.
    Every chapter also folds at least one cell, so the rule cannot pass by counting nothing.
    """
    tags = [cell.metadata.get("tags", []) for cell in read_source(source).cells]
    assert any("hide-input" in cell_tags for cell_tags in tags), "no cell is folded"
    too_much = printing_too_much(source)
    assert not too_much, (
        f"visible cells printing more than {PRINT_LINES_SHOWN} lines (move the printing into "
        f"a cell tagged hide-input): {too_much}"
    )


def test_the_sources_carry_no_colab_cell_and_no_outputs():
    for source in SOURCES:
        text = source.read_text()
        assert "google.colab" not in text, (
            f"{source.name}: the Colab cell is generated, not written"
        )
        assert text.startswith("---\njupytext:"), f"{source.name} is not a jupytext MyST notebook"


def test_the_repository_url_comes_from_the_config(tmp_path):
    (tmp_path / "chapters").mkdir()
    shutil.copy(REPO / "chapters" / "01_two_phases.md", tmp_path / "chapters")
    (tmp_path / "_config.yml").write_text("repository:\n  url: https://example.org/me/fork/\n")
    write_notebooks(tmp_path)
    first = nbformat.read(str(tmp_path / "chapters" / "01_two_phases.ipynb"), as_version=4).cells[0]
    assert 'git+https://example.org/me/fork"' in first.source


def test_the_command_reports_drift_and_fixes_it(tmp_path, capsys):
    from memwall.cli import main

    (tmp_path / "solutions").mkdir()
    shutil.copy(REPO / "solutions" / "01_two_phases.md", tmp_path / "solutions")
    assert main(["notebooks", "--root", str(tmp_path), "--check"]) == 1
    assert "exercises/01_two_phases.ipynb" in capsys.readouterr().out
    assert main(["notebooks", "--root", str(tmp_path)]) == 0
    assert main(["notebooks", "--root", str(tmp_path), "--check"]) == 0
    assert main(["notebooks", "--root", str(tmp_path / "nowhere")]) == 2


# --- Pages that do not depend on the builder -------------------------------------------------
# The book's output column shows about 92 characters (tests/test_book.py measures the built
# pages); a line that prints a CPU's or GPU's model name must fit it whatever the name is.
OUTPUT_COLUMN_CHARS = 92
LONG_NAME = "Imaginary(R) Processor " + "X" * 77  # 100 characters: longer than any real name
NAME_ATTRIBUTES = {"device", "cpu_model"}  # Measurement.device, a fingerprint's cpu_model


class _Anything(float):
    """Stands for every value a print needs but the test does not care about: a number that
    formats with any float spec, and an object whose attributes, items and calls are more of
    the same. Its `.device` is the long model name."""

    def __new__(cls, value=1.0):
        return super().__new__(cls, value)

    def __getattr__(self, name):
        return LONG_NAME if name in NAME_ATTRIBUTES else _Anything()

    def __getitem__(self, key):
        return _Anything()

    def __iter__(self):  # empty: without it, __getitem__ would make an endless iterator
        return iter(())

    def __call__(self, *args, **kwargs):
        return _Anything()

    def get(self, key, default=None):
        return LONG_NAME if key in NAME_ATTRIBUTES else _Anything()


def _prints_a_name(node) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
        and any(
            (isinstance(n, ast.Attribute) and n.attr in NAME_ATTRIBUTES)
            or (isinstance(n, ast.Constant) and n.value in NAME_ATTRIBUTES)
            for n in ast.walk(node)
        )
    )


def name_printing_calls(source: Path) -> list[tuple[ast.Call, dict]]:
    """Each print() in a chapter's code that prints a model name, with the namespace to run it
    in: the chapter's own memwall imports for the names it uses, a stand-in for the rest."""
    calls, imports = [], {}
    for cell in read_source(source).cells:
        if cell.cell_type != "code" or cell.get("id") == COLAB_CELL_ID:
            continue
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memwall"):
                for alias in node.names:
                    imports[alias.asname or alias.name] = (node.module, alias.name)
            elif _prints_a_name(node):
                calls.append(node)
    found = []
    for call in calls:
        namespace = {}
        for name in {n.id for n in ast.walk(call) if isinstance(n, ast.Name)}:
            if name in imports:
                module, attribute = imports[name]
                namespace[name] = getattr(importlib.import_module(module), attribute)
            elif not hasattr(builtins, name):
                namespace[name] = _Anything()
        found.append((call, namespace))
    return found


def printed(call: ast.Call, namespace: dict) -> list[str]:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        eval(compile(ast.Expression(call), "<print>", "eval"), namespace)
    return output.getvalue().splitlines()


def test_the_name_check_catches_a_print_that_widens_with_the_name(tmp_path):
    source = tmp_path / "chapter.md"
    source.write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n---\n\n"
        "```{code-cell}\nfrom memwall.verdicts import shorten\n"
        'print(f"{machine.device}: {machine.threads} thread(s)")\n'
        'print(f"{shorten(machine.device)}: {machine.threads:.0f} thread(s)")\n'
        'print("unrelated")\n```\n'
    )
    (raw, raw_names), (short, short_names) = name_printing_calls(source)
    assert printed(raw, raw_names) == [f"{LONG_NAME}: 1.0 thread(s)"]
    assert len(printed(short, short_names)[0]) <= OUTPUT_COLUMN_CHARS


# Chapters that print a machine's name whole, wider than the page for a long name. None since
# issue 36 (names go through memwall.verdicts.shorten); strict, so a fixed chapter fails here.
NAME_WIDENS = set()


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(
            path,
            marks=[pytest.mark.xfail(strict=True, reason="prints the name whole")]
            if path.stem in NAME_WIDENS
            else [],
        )
        for path in sorted((REPO / "chapters").glob("*.md"))
    ],
    ids=lambda p: p.stem,
)
def test_no_printed_line_widens_with_the_machines_name(source):
    """Every print that shows a CPU's or GPU's model name fits the output column even for a
    100-character name: the pages must not depend on the machine that built them."""
    too_wide = [
        line
        for call, namespace in name_printing_calls(source)
        for line in printed(call, namespace)
        if len(line) > OUTPUT_COLUMN_CHARS
    ]
    assert not too_wide, f"{len(too_wide)} line(s) over {OUTPUT_COLUMN_CHARS}: {too_wide[:2]}"


# Exercise pages whose code (hints included: a blank exercise raises NotImplementedError with
# its hint, wrapped by the student-copy generator) is wider than the page. None since issue 37's
# hints; strict, so a page that fits fails here until it is removed.
EXERCISES_TOO_WIDE = set()


@pytest.mark.parametrize(
    "notebook",
    [
        pytest.param(
            path,
            marks=[pytest.mark.xfail(strict=True, reason="hints wider than the page")]
            if path.stem[:2] in EXERCISES_TOO_WIDE
            else [],
        )
        for path in sorted((REPO / "exercises").glob("*.ipynb"))
    ],
    ids=lambda p: p.stem,
)
def test_exercise_code_fits_the_page_width(notebook):
    """A student's page shows every code line whole, the hint in each blank exercise included
    (the Colab install cell is hidden on the built page)."""
    too_wide = [
        line
        for cell in nbformat.read(str(notebook), as_version=4).cells
        if cell.cell_type == "code" and cell.get("id") != COLAB_CELL_ID
        for line in cell.source.splitlines()
        if len(line) > CODE_COLUMN_CHARS
    ]
    assert not too_wide, f"{len(too_wide)} code line(s) over {CODE_COLUMN_CHARS}: {too_wide[:3]}"
