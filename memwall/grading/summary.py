"""The instructor's one-page summary of a grading run, in Markdown, written beside grades.csv.

For each exercise (check): how many notebooks earned full, partial and no points, and the mean;
for each handed-out notebook: a histogram of the totals; the failure messages seen most often
(numbers masked, so the same mistake on different hidden cases counts once); and every row that
needs a look (errors, timeouts, restored or flagged notebooks). Student names and messages are
untrusted text: they are cut, put on one line and have Markdown's table and code marks escaped.
"""

import re
from collections import Counter, defaultdict
from pathlib import Path

from memwall.grading.safe_files import write_atomically

TOP_MESSAGES = 10
MESSAGE_CHARACTERS = 140
HISTOGRAM_BINS = 5
# A number standing alone (not the 09 of "ch09"): a hidden case's input or result.
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d_]*(\.\d+)?(e[-+]?\d+)?", re.IGNORECASE)


def summary_path(out_csv) -> Path:
    """grades.csv -> grades.summary.md"""
    out_csv = Path(out_csv)
    return out_csv.with_name(f"{out_csv.stem}.summary.md")


def write_summary(rows, out_csv) -> Path:
    path = summary_path(out_csv)
    write_atomically(path, summary_markdown(rows, Path(out_csv).name))
    return path


def summary_markdown(rows, csv_name="grades.csv") -> str:
    rows = list(rows)
    students = {row.student for row in rows}
    # A file that could not be graded has no score: it would count as a zero in every table.
    graded = [row for row in rows if row.graded]
    not_graded = len(rows) - len(graded)
    lines = [f"# Grading summary: {clean(csv_name)}", "",
             f"{len(rows)} notebooks from {len(students)} students; "
             f"{sum(1 for row in rows if row.status == 'ok')} ran cleanly"
             + (f"; {not_graded} could not be graded (see the rows to look at)." if not_graded
                else "."), ""]  # fmt: skip
    lines += same_but_letter_case(students)
    lines += exercise_table(graded) + totals_histograms(graded) + frequent_failures(graded)
    lines += flagged_rows(rows)
    return "\n".join(lines) + "\n"


def students_told_apart_by_case(students) -> list:
    """Groups of student names that differ only in letter case ("Bob", "bob"): one student
    under two spellings, more likely than two students."""
    groups = defaultdict(set)
    for name in students:
        groups[name.casefold()].add(name)
    return [sorted(group) for _, group in sorted(groups.items()) if len(group) > 1]


def same_but_letter_case(students):
    groups = students_told_apart_by_case(students)
    if not groups:
        return []
    names = "; ".join(" / ".join(clean(name) for name in group) for group in groups)
    return [f"Names that differ only in letter case, graded as different students: {names}.", ""]


def exercise_table(rows):
    by_check = defaultdict(list)
    for row in rows:
        for result in row.checks:
            by_check[result.name].append(result)
    if not by_check:
        return ["No checks were graded.", ""]
    lines = ["## Scores per exercise", "",
             "| exercise | points | notebooks | full | partial | none | mean |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name in sorted(by_check):
        results = by_check[name]
        points = max(result.points for result in results)
        full = sum(1 for r in results if r.points and r.earned >= r.points)
        none = sum(1 for r in results if r.earned <= 0)
        mean = sum(r.earned for r in results) / len(results)
        lines.append(f"| {clean(name)} | {points:g} | {len(results)} | {full} | "
                     f"{len(results) - full - none} | {none} | {mean:.2f} |")  # fmt: skip
    return lines + [""]


def totals_histograms(rows):
    lines = ["## Totals per notebook", ""]
    by_notebook = defaultdict(list)
    for row in rows:
        by_notebook[row.chapter or row.notebook].append(row)
    for notebook in sorted(by_notebook):
        group = by_notebook[notebook]
        most = max((row.max_points for row in group), default=0) or 1
        counts = Counter(min(HISTOGRAM_BINS - 1, int(row.total / most * HISTOGRAM_BINS))
                         for row in group)  # fmt: skip
        lines.append(f"**{clean(notebook)}** (out of {most:g}):")
        lines.append("```")
        for index in range(HISTOGRAM_BINS):
            low, high = index * 100 // HISTOGRAM_BINS, (index + 1) * 100 // HISTOGRAM_BINS
            lines.append(f"{low:3d}-{high:3d}% {'#' * counts[index]:<30} {counts[index]}")
        lines += ["```", ""]
    return lines


def frequent_failures(rows):
    counts = Counter()
    example = {}
    for row in rows:
        for result in row.checks:
            if result.earned < result.points and result.message:
                key = (result.name, pattern(result.message))
                counts[key] += 1
                example.setdefault(key, result.message)
    lines = ["## Most frequent failures", ""]
    if not counts:
        return lines + ["None.", ""]
    lines += ["| count | exercise | message (numbers masked as #) |", "|---:|---|---|"]
    for (name, message), count in counts.most_common(TOP_MESSAGES):
        lines.append(f"| {count} | {clean(name)} | {clean(message)} |")
    return lines + [""]


def flagged_rows(rows):
    flagged = [row for row in rows if row.status != "ok"]
    lines = ["## Rows to look at", ""]
    if not flagged:
        return lines + ["None: every notebook ran cleanly.", ""]
    lines += ["| student | notebook | status |", "|---|---|---|"]
    for row in sorted(flagged, key=lambda r: (r.student, r.notebook)):
        lines.append(f"| {clean(row.student)} | {clean(row.notebook)} | {clean(row.status)} |")
    return lines + [""]


def pattern(message: str) -> str:
    """A failure message with its numbers masked, first line only, so alike mistakes group."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    if "not implemented yet" in first:  # the hint after it differs per exercise, not per student
        return first.split("not implemented yet")[0] + "not implemented yet"
    return _NUMBER.sub("#", first)


def clean(text) -> str:
    """Untrusted text as one short table-safe line."""
    text = " ".join(str(text).split())
    if len(text) > MESSAGE_CHARACTERS:
        text = text[: MESSAGE_CHARACTERS - 3] + "..."
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
