"""What the grader writes: grades.csv, one feedback file per notebook, a terminal summary."""

import csv
from pathlib import Path

FIXED_COLUMNS = ("student", "notebook")
TOTAL_COLUMNS = ("total", "max", "status")


def write_csv(rows, out_csv):
    """One row per (student, notebook); one column per check, in chapter then notebook order."""
    check_columns = []
    for row in sorted(rows, key=lambda r: r.chapter):
        for result in row.checks:
            if result.name not in check_columns:
                check_columns.append(result.name)
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(out_csv, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*FIXED_COLUMNS, *check_columns, *TOTAL_COLUMNS])
        for row in rows:
            earned = {result.name: number(result.earned) for result in row.checks}
            writer.writerow(
                [row.student, row.notebook]
                + [earned.get(name, "") for name in check_columns]
                + [number(row.total), number(row.max_points), row.status]
            )


def write_feedback(row, path):
    """A plain-text report for one student: score, status, and each check's result."""
    lines = [
        f"memwall feedback for {row.student}: {row.notebook}",
        f"score: {number(row.total)} / {number(row.max_points)}",
        f"status: {row.status}",
        "",
    ]
    for result in row.checks:
        passed = result.earned == result.points and result.points
        lines.append(
            f"{'✓' if passed else '✗'} {result.name} ({number(result.earned)}/{number(result.points)} points)"
        )
        lines += [f"    {line}" for line in result.message.splitlines()]
    if "restored" in row.status:
        lines += [
            "",
            "Check cells and cell order were put back as in the handed-out notebook;",
            "only the original checks count.",
        ]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def print_summary(rows, skipped, out_csv, feedback_dir, seconds):
    problems = [row for row in rows if not row.ok]
    students = {row.student for row in rows}
    print(
        f"graded {len(rows)} notebooks from {len(students)} students in {seconds:.0f} s -> {out_csv}"
    )
    if feedback_dir is not None:
        print(f"feedback files in {feedback_dir}/")
    for row in problems:
        print(f"  {row.student}, {row.notebook}: {row.status}")
    if skipped:
        print(
            f"skipped {len(skipped)} files that are not notebooks: {', '.join(p.name for p in skipped[:5])}"
        )


def number(value):
    """2.0 -> 2 so the CSV reads like points, not floats."""
    return int(value) if float(value).is_integer() else round(value, 3)
