"""The batch survives any file name and any neighbour: every submission gets a row, the summary is
written, nothing a student named reaches the terminal or the CSV raw, two runs cannot share one
CSV, and an enormous notebook is refused before the grader spends time or memory on it."""

import csv
import json
import os
import threading
from pathlib import Path

import pytest

from memwall.grading import grade
from memwall.grading.names import MAX_FILE_NAME_BYTES, feedback_file_name, readable
from memwall.grading.report import OutputLock
from memwall.grading.sandbox import bwrap_path
from memwall.grading.submissions import MAX_CELLS

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"
ESCAPE = "\x1b]0;owned\x07\x1b[2J"


def sandbox_here():
    """Unsandboxed where that is allowed; as root only the sandbox may run student code."""
    if os.geteuid() != 0:
        return False
    if bwrap_path() is None:
        pytest.skip("as root the grader needs bubblewrap, which cannot run here")
    return True


def grade_quietly(subs, out, feedback, capsys):
    rows = grade(subs, out, feedback_dir=feedback, solutions_dir=SOLUTIONS, sandbox=sandbox_here())
    return rows, capsys.readouterr()


def test_long_non_utf8_and_escape_code_names_each_get_a_row(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    long_file = "a" * 237 + "__00_demo.ipynb"  # 252 bytes: the longest a file system allows
    assert len(long_file.encode()) <= 255
    (subs / long_file).write_text("not json")
    (subs / ("b" * 250)).mkdir()  # a student folder of 250 bytes
    (subs / ("b" * 250) / "00_demo.ipynb").write_text("not json")
    with open(os.path.join(os.fsencode(subs), b"Jos\xe9__00_demo.ipynb"), "w") as handle:
        handle.write("not json")  # a Latin-1 name, as a zip from an older system has it
    (subs / f"eve{ESCAPE}__00_demo.ipynb").write_text("not json")
    (subs / "zed__00_demo.ipynb").write_text("not json")  # sorts last: the rows after survive
    out, feedback = tmp_path / "grades.csv", tmp_path / "feedback"

    rows, printed = grade_quietly(subs, out, feedback, capsys)

    assert len(rows) == 5
    with open(out, newline="", encoding="utf-8") as handle:
        table = list(csv.DictReader(handle))
    students = {row["student"] for row in table}
    assert "José" in students and "zed" in students
    assert any(name.startswith("a" * 50) for name in students)
    assert any(name.startswith("b" * 50) for name in students)
    assert all(row["status"] == "not JSON" for row in table)
    assert "\x1b" not in out.read_text() and "\x07" not in out.read_text()
    assert "\x1b" not in printed.out + printed.err
    names = sorted(p.name for p in feedback.iterdir())
    assert len(names) == 5
    assert all(len(name.encode()) <= MAX_FILE_NAME_BYTES for name in names)
    assert all("\x1b" not in name for name in names)
    assert (tmp_path / "grades.summary.md").exists() or list(tmp_path.glob("*summary*"))


def test_names_are_readable_and_feedback_names_portable():
    assert readable(os.fsdecode(b"Jos\xe9")) == "José"
    assert readable("e\u0301ve") == "\u00e9ve"
    assert "\x1b" not in readable(f"x{ESCAPE}")
    assert feedback_file_name("../../etc/passwd", "00_demo") == "etc_passwd__00_demo.txt"
    long = feedback_file_name("ü" * 200, "00_demo")
    assert len(long.encode()) <= MAX_FILE_NAME_BYTES and long.endswith(".txt")
    assert long != feedback_file_name("ü" * 199 + "v", "00_demo")


def test_a_second_run_on_the_same_csv_stops_with_a_clear_message(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "ann__00_demo.ipynb").write_text("not json")  # graded without a kernel
    out = tmp_path / "grades.csv"
    with OutputLock(out):
        with pytest.raises(ValueError, match="another memwall grade is writing"):
            grade(
                tmp_path / "subs",
                out,
                solutions_dir=SOLUTIONS,
                sandbox=sandbox_here(),
                progress=False,
            )
    # Released: the next run goes ahead.
    (row,) = grade(tmp_path / "subs", out, solutions_dir=SOLUTIONS, sandbox=sandbox_here(),
                   progress=False)  # fmt: skip
    assert row.status == "not JSON"


def test_two_concurrent_runs_lose_no_row(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("ann", "bob", "cy"):
        (subs / f"{name}__00_demo.ipynb").write_text("not json")
    out, errors = tmp_path / "grades.csv", []

    def run():
        try:
            grade(subs, out, solutions_dir=SOLUTIONS, sandbox=sandbox_here(), progress=False)
        except ValueError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(out, newline="", encoding="utf-8") as handle:
        assert sorted(row["student"] for row in csv.DictReader(handle)) == ["ann", "bob", "cy"]
    assert all("another memwall grade" in error for error in errors)


def test_a_notebook_of_too_many_cells_is_refused_before_restore(tmp_path, capsys):
    subs = tmp_path / "subs"
    subs.mkdir()
    cell = {"cell_type": "code", "source": "1", "metadata": {}, "outputs": [],
            "execution_count": None}  # fmt: skip
    notebook = {"cells": [cell] * (MAX_CELLS * 50), "metadata": {}, "nbformat": 4,
                "nbformat_minor": 5}  # fmt: skip
    (subs / "big__00_demo.ipynb").write_text(json.dumps(notebook))
    rows, _ = grade_quietly(subs, tmp_path / "g.csv", None, capsys)
    assert rows[0].status.startswith(f"refused: {MAX_CELLS * 50} cells")
    assert rows[0].seconds < 5


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is for a grader running as root")
def test_as_root_the_grader_refuses_to_run_student_code_unsandboxed(tmp_path):
    (tmp_path / "subs").mkdir()
    with pytest.raises(ValueError, match="student code would run with root's rights"):
        grade(tmp_path / "subs", tmp_path / "g.csv", solutions_dir=SOLUTIONS, sandbox=False,
              progress=False)  # fmt: skip
