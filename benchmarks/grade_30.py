"""Benchmark: grade 30 generated submissions of one chapter and print the wall time.

    python benchmarks/grade_30.py [--chapter 01_two_phases] [--jobs N] [--keep DIR]

A benchmark, not a test: it asserts nothing beyond "every row came back". The default is the
small demo chapter of the grading tests, whose submissions mix right, blank and wrong answers (a
third each); `--chapter` grades a real chapter of solutions/, half right and half blank.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

import nbformat

from memwall.grading import grade, make_student_copy

REPO = Path(__file__).resolve().parents[1]
DEMO_SOLUTIONS = REPO / "tests" / "fixtures" / "grading" / "solutions"
DEMO_CHAPTER = "00_demo"
STUDENTS = 30
WRONG_BODIES = {
    "ex1": "def matrix_bytes(rows, cols, bytes_per_element):\n    return rows * cols\n",
    "ex2": "def matmul_intensity(m, n, k, bytes_per_element):\n    return 1.0\n",
    "ex3": "def decode_ceilings(bandwidth_gb_s, model_sizes_gb):\n    return []\n",
}


def make_class(folder: Path, solutions: Path, chapter: str):
    solution = nbformat.read(str(solutions / f"{chapter}.ipynb"), as_version=4)
    blank = make_student_copy(solution, f"{chapter}.ipynb")
    kinds = [solution, blank]
    if chapter == DEMO_CHAPTER:
        wrong = make_student_copy(solution, f"{chapter}.ipynb")
        for cell in wrong.cells:
            cell.source = WRONG_BODIES.get(cell.get("id"), cell.source)
        kinds.append(wrong)
    for number in range(STUDENTS):
        nb = kinds[number % len(kinds)]
        nbformat.write(nb, str(folder / f"student{number:02d}__{chapter}.ipynb"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--chapter", default=DEMO_CHAPTER, help="a notebook name in solutions/, without .ipynb"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="write submissions, grades.csv and feedback here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        (root / "submissions").mkdir(parents=True, exist_ok=True)
        solutions = DEMO_SOLUTIONS if args.chapter == DEMO_CHAPTER else REPO / "solutions"
        make_class(root / "submissions", solutions, args.chapter)
        started = time.perf_counter()
        rows = grade(root / "submissions", root / "grades.csv", feedback_dir=root / "feedback",
                     jobs=args.jobs, cell_timeout=60, timeout=300, solutions_dir=solutions)  # fmt: skip
        seconds = time.perf_counter() - started
    assert len(rows) == STUDENTS
    per_notebook = sorted(row.seconds for row in rows)
    print(f"graded {STUDENTS} notebooks of {args.chapter} with --jobs {args.jobs} in {seconds:.1f} s wall "
          f"({seconds / STUDENTS:.2f} s per notebook; median single notebook {per_notebook[STUDENTS // 2]:.1f} s) "
          f"on {os.cpu_count()} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
