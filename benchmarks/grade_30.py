"""Benchmark: grade 30 generated submissions of one chapter, sandboxed and not, side by side.

    python benchmarks/grade_30.py [--chapter 01_two_phases] [--jobs 2] [--rounds 1] [--keep DIR]

A benchmark, not a test: it asserts nothing beyond "every row came back with the expected
points". Each round grades the same class twice, with the bubblewrap sandbox and without it,
alternating which goes first, so a busy machine slows both alike; it prints the medians and
their ratio and records them (benchmarks/results/grade_30_<chapter>-<machine id>-<date>.json). The default is the
small demo chapter of the grading tests, whose submissions mix right, blank and wrong answers (a
third each); `--chapter` grades a real chapter of solutions/, half right and half blank.
"""

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import nbformat

from memwall.bench.records import save_record
from memwall.grading import grade
from memwall.grading.sandbox import bwrap_path
from memwall.grading.sync import notebooks_in, read_notebook
from memwall.machine.fingerprint import machine_fingerprint
from memwall.notebooks import student_copy

REPO = Path(__file__).resolve().parents[1]
DEMO_SOLUTIONS = REPO / "tests" / "fixtures" / "grading" / "solutions"
DEMO_CHAPTER = "00_demo"
STUDENTS = 30
WRONG_BODIES = {
    "ex1": "def matrix_bytes(rows, cols, bytes_per_element):\n    return rows * cols\n",
    "ex2": "def matmul_intensity(m, n, k, bytes_per_element):\n    return 1.0\n",
    "ex3": "def decode_ceilings(bandwidth_gb_s, model_sizes_gb):\n    return []\n",
}


def make_class(folder: Path, solutions: Path, chapter: str) -> list:
    """Write the class; return the expected total of each student, in order."""
    path = next(p for p in notebooks_in(solutions) if p.stem == chapter)
    solution = read_notebook(path)
    blank = student_copy(path, solution)[0]  # as `memwall notebooks` makes it
    kinds = [solution, blank]
    if chapter == DEMO_CHAPTER:
        wrong = student_copy(path, solution)[0]
        for cell in wrong.cells:
            cell.source = WRONG_BODIES.get(cell.get("id"), cell.source)
        kinds.append(wrong)
    expected = []
    for number in range(STUDENTS):
        nb = kinds[number % len(kinds)]
        nbformat.write(nb, str(folder / f"student{number:02d}__{chapter}.ipynb"))
        expected.append("full" if nb is solution else 0)
    return expected


def grade_once(root, solutions, jobs, sandbox, expected):
    started = time.perf_counter()
    rows = grade(root / "submissions", root / f"grades-{sandbox}.csv", jobs=jobs, cell_timeout=60,
                 timeout=300, solutions_dir=solutions, progress=False, sandbox=sandbox)  # fmt: skip
    seconds = time.perf_counter() - started
    assert len(rows) == STUDENTS
    for row, want in zip(sorted(rows, key=lambda r: r.student), expected, strict=True):
        assert row.total == (row.max_points if want == "full" else want), (row.student, row.status)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", default=DEMO_CHAPTER, help="a notebook name in solutions/")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="write the submissions and grades.csv here")
    args = parser.parse_args()
    if bwrap_path() is None:
        raise SystemExit("bwrap is not available: nothing to compare (install bubblewrap)")
    # As root the grader refuses to run student code unsandboxed (issue 37): time the sandbox only.
    kinds = (True,) if os.geteuid() == 0 else (True, False)
    times = {kind: [] for kind in kinds}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        (root / "submissions").mkdir(parents=True, exist_ok=True)
        solutions = DEMO_SOLUTIONS if args.chapter == DEMO_CHAPTER else REPO / "solutions"
        expected = make_class(root / "submissions", solutions, args.chapter)
        for round_number in range(args.rounds):
            order = kinds if round_number % 2 == 0 else kinds[::-1]
            for sandbox in order:
                times[sandbox].append(grade_once(root, solutions, args.jobs, sandbox, expected))
    sandboxed = statistics.median(times[True])
    plain = statistics.median(times[False]) if False in times else None
    result = {
        "chapter": args.chapter, "students": STUDENTS, "jobs": args.jobs, "rounds": args.rounds,
        "sandboxed_s": times[True], "unsandboxed_s": times.get(False),
        "median_sandboxed_s": sandboxed, "median_unsandboxed_s": plain,
        "sandbox_over_plain": sandboxed / plain if plain else None,
        "cpus": os.cpu_count(), "platform": platform.platform(), "machine": machine_fingerprint(),
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
    }  # fmt: skip
    out = save_record(result, f"grade_30_{args.chapter}")
    versus = (
        f"unsandboxed {plain:.1f} s (x{sandboxed / plain:.2f})"
        if plain
        else "as root: no unsandboxed run"
    )
    print(f"graded {STUDENTS} notebooks of {args.chapter} with --jobs {args.jobs}: sandboxed "
          f"{sandboxed:.1f} s, {versus}, median of {args.rounds} round(s), on "
          f"{os.cpu_count()} CPUs, load {load_before:.1f} -> {out}")  # fmt: skip


if __name__ == "__main__":
    main()
