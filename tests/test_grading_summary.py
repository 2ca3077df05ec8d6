"""The instructor's one-page summary written beside grades.csv."""

from memwall.grading.grader import CheckResult, GradeRow
from memwall.grading.report import ReportWriter
from memwall.grading.summary import pattern, summary_markdown, summary_path


def row(student, earned, status="ok", message="ch09.ab_slowdown: expected 1.5, got 1.73"):
    checks = [
        CheckResult("ch09.ab_slowdown", 3, earned[0], "ok" if earned[0] == 3 else message),
        CheckResult(
            "ch09.moe_weight_bytes", 2, earned[1], "ok" if earned[1] == 2 else "not implemented yet"
        ),
    ]
    return GradeRow(student, f"{student}.ipynb", "09_measuring", checks, status, max_points=5)


def test_summary_counts_scores_failures_and_flagged_rows():
    rows = [
        row("ada", (3, 2)),
        row("bob", (0, 2), message="ch09.ab_slowdown: expected 1.5, got 1.73"),
        row("cy", (0, 0), message="ch09.ab_slowdown: expected 0.82, got 0.95"),
        row("dee", (0, 0), status="timed out after 900 s"),
    ]
    text = summary_markdown(rows)
    assert "4 notebooks from 4 students; 3 ran cleanly." in text
    assert "| ch09.ab_slowdown | 3 | 4 | 1 | 0 | 3 | 0.75 |" in text
    assert "| ch09.moe_weight_bytes | 2 | 4 | 2 | 0 | 2 | 1.00 |" in text
    # the same mistake on different hidden cases counts once, with all three notebooks
    assert "| 3 | ch09.ab_slowdown | ch09.ab_slowdown: expected #, got # |" in text
    assert "| dee | dee.ipynb | timed out after # s |" not in text  # statuses are not masked
    assert "| dee | dee.ipynb | timed out after 900 s |" in text
    assert "  0- 20% ##" in text and " 80-100% # " in text


def test_files_that_could_not_be_graded_count_in_no_score():
    duplicate = row("eve", (0, 0), status="duplicate: eve/09_measuring.ipynb and 1 other file")
    duplicate.graded = False
    text = summary_markdown([row("ada", (3, 2)), duplicate, row("Ada", (3, 0))])
    assert "3 notebooks from 3 students; 2 ran cleanly; 1 could not be graded" in text
    assert "| ch09.ab_slowdown | 3 | 2 | 2 | 0 | 0 | 3.00 |" in text  # eve's zeros left out
    assert "  0- 20%                                0" in text
    assert "| not run |" not in text and "| eve | eve.ipynb | duplicate: " in text
    assert "differ only in letter case, graded as different students: Ada / ada." in text


def test_untrusted_text_cannot_break_the_tables():
    rows = [row("eve | x\n# heading", (0, 0), status="error: `rm` | boom")]
    text = summary_markdown(rows)
    assert "| eve \\| x # heading | " in text and "\\`rm\\` \\| boom" in text
    assert "\n# heading" not in text


def test_pattern_masks_numbers_and_keeps_the_first_line():
    assert pattern("got 1.5e-3 and 42\nmore") == "got # and #"
    assert (
        pattern("ch09.x: not implemented yet (Exercise 2: a hint)") == "ch09.x: not implemented yet"
    )


def test_the_report_writer_writes_the_summary_beside_the_csv(tmp_path):
    writer = ReportWriter(tmp_path / "grades.csv")
    writer.add(row("ada", (3, 2)))
    writer.finish()
    assert summary_path(tmp_path / "grades.csv") == tmp_path / "grades.summary.md"
    assert "# Grading summary: grades.csv" in (tmp_path / "grades.summary.md").read_text()
