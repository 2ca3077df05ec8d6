"""The MyST sources are the only hand-edited notebooks; everything committed beside them is generated.

The drift test regenerates every notebook in a temporary copy of the sources and requires the
committed files to be byte-identical: edit chapters/*.md or solutions/*.md, then `make notebooks`.
"""

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
    # key: 9 files of recorded widget curves and 9 of practice cases.
    assert len(written) == 36, written
    for relative in written:
        committed = REPO / relative
        assert committed.is_file(), f"{relative} is missing: run `make notebooks` and commit it"
        assert committed.read_bytes() == (copy / relative).read_bytes(), (
            f"{relative} differs from its source: run `make notebooks` and commit it"
        )
    generated = {p.relative_to(REPO).as_posix() for p in REPO.glob("chapters/*.ipynb")}
    generated |= {p.relative_to(REPO).as_posix() for p in REPO.glob("exercises/*.ipynb")}
    generated |= {p.relative_to(REPO).as_posix() for p in REPO.glob("memwall/widgets/curves/*")}
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
