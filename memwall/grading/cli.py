"""`memwall exercises` and `memwall grade`, plugged into the `memwall` command by register_cli.

`memwall exercises` is `memwall notebooks` for exercises/ alone: the same generator
(``memwall.notebooks.student_copy``), plus a lint of the solutions' exercise format.
"""

import json
import sys
from pathlib import Path

from memwall.grading.grader import DEFAULT_CELL_TIMEOUT, DEFAULT_NOTEBOOK_TIMEOUT
from memwall.grading.sandbox import Limits

EXIT_PROBLEMS = 1


def register_cli(subparsers):
    exercises = subparsers.add_parser(
        "exercises",
        help="`memwall notebooks` for exercises/ only, with a format lint (or --check)",
        description=(
            "Write the student copy of every solutions/*.md into exercises/, with the same "
            "generator as `memwall notebooks`, and list format problems in the solutions."
        ),
    )
    exercises.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if out of sync"
    )
    exercises.add_argument("--solutions", default="solutions", help="folder of solution notebooks")
    exercises.add_argument("--exercises", default="exercises", help="folder of student copies")
    exercises.add_argument("--json", action="store_true", help="print the result as JSON")
    exercises.set_defaults(run=run_exercises)

    grade = subparsers.add_parser(
        "grade",
        help="grade a folder of submitted notebooks into a CSV",
        description=(
            "Grade <student>__NN_slug.ipynb (or <student>/NN_slug.ipynb) files against "
            "solutions/NN_slug.md: one CSV row per notebook, one feedback file each."
        ),
    )
    grade.add_argument(
        "submissions", metavar="SUBMISSIONS_DIR", help="folder of submitted notebooks"
    )
    grade.add_argument("--out", default="grades.csv", help="CSV to write (default: grades.csv)")
    grade.add_argument(
        "--feedback", metavar="DIR", default=None, help="write one feedback .txt per notebook here"
    )
    grade.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_NOTEBOOK_TIMEOUT,
        metavar="SECONDS",
        help=f"wall-clock limit per notebook (default {DEFAULT_NOTEBOOK_TIMEOUT})",
    )
    grade.add_argument(
        "--cell-timeout",
        type=float,
        default=DEFAULT_CELL_TIMEOUT,
        metavar="SECONDS",
        help=f"limit per cell (default {DEFAULT_CELL_TIMEOUT})",
    )
    grade.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="notebooks graded in parallel"
    )
    grade.add_argument(
        "--call-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="limit per call of a student's function (default: the cell timeout)",
    )
    grade.add_argument(
        "--solutions", default="solutions", metavar="DIR", help="folder of solution notebooks"
    )
    grade.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run notebooks without bubblewrap (student code can then touch your files)",
    )
    grade.add_argument(
        "--memory-limit",
        type=float,
        default=Limits.memory_bytes / 2**30,
        metavar="GB",
        help=(
            "memory of one notebook, its processes together (a memory cgroup where one can be "
            f"made) and each process (default {Limits.memory_bytes / 2**30:g})"
        ),
    )
    grade.add_argument(
        "--bind-ro",
        action="append",
        default=[],
        metavar="PATH",
        help="a further folder the sandbox may read, e.g. a model cache (repeatable)",
    )
    grade.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of a summary"
    )
    grade.set_defaults(run=run_grade)


def run_exercises(args) -> int:
    from memwall.grading.solution_format import validate_solution
    from memwall.grading.sync import notebooks_in, read_notebook, sync_exercises

    solutions = notebooks_in(Path(args.solutions)) if Path(args.solutions).is_dir() else []
    if not solutions:  # "in sync" with nothing would be a false all-clear
        raise ValueError(f"no solution notebooks in {args.solutions!r} (use --solutions DIR)")
    problems = {str(path): validate_solution(read_notebook(path)) for path in solutions}
    problems = {path: found for path, found in problems.items() if found}
    out_of_sync = sync_exercises(args.solutions, args.exercises, check=args.check)
    if args.json:
        print(
            json.dumps(
                {
                    "out_of_sync": out_of_sync,
                    "format_problems": problems,
                    "written": not args.check,
                },
                indent=2,
            )
        )
    else:
        verb = "out of sync" if args.check else "regenerated"
        for line in out_of_sync:
            print(f"{verb}: {line}")
        for path, found in problems.items():
            for problem in found:
                print(f"{path}: {problem}", file=sys.stderr)
        if not out_of_sync and not problems:
            print(f"{args.exercises}/ is in sync with {args.solutions}/")
    failed = bool(problems) or (args.check and bool(out_of_sync))
    return EXIT_PROBLEMS if failed else 0


def run_grade(args) -> int:
    """Exit 0 when every notebook was graded, 1 when one could not be (its status says why)."""
    from dataclasses import replace

    from memwall.grading.grader import check_ready, grade

    check_ready(args.timeout, args.cell_timeout, args.jobs, args.call_timeout)
    if not args.memory_limit > 0:
        raise ValueError(f"--memory-limit must be a positive number of GB, got {args.memory_limit}")
    if not Path(args.submissions).is_dir():
        raise ValueError(f"no submissions folder {args.submissions!r}")
    if not Path(args.solutions).is_dir():
        raise ValueError(f"no solutions folder {args.solutions!r} (use --solutions DIR)")
    limits = replace(Limits(), memory_bytes=int(args.memory_limit * 2**30))
    rows = grade(
        args.submissions, args.out, feedback_dir=args.feedback, timeout=args.timeout,
        cell_timeout=args.cell_timeout, jobs=args.jobs, solutions_dir=args.solutions,
        progress=not args.json, sandbox="auto" if not args.no_sandbox else False,
        call_timeout=args.call_timeout, limits=limits, read_only_paths=args.bind_ro,
    )  # fmt: skip
    if args.json:
        print(json.dumps([row_as_dict(row) for row in rows], indent=2))
    ungraded = [row for row in rows if not row.graded]
    for row in ungraded:
        print(f"could not grade {row.student}, {row.notebook}: {row.status}", file=sys.stderr)
    return EXIT_PROBLEMS if ungraded else 0


def row_as_dict(row) -> dict:
    checks = row.checks if row.graded else []  # not graded: no score (null), not a zero
    return {
        "student": row.student,
        "notebook": row.notebook,
        "graded": row.graded,
        "points": {result.name: result.earned for result in checks},
        "messages": {result.name: result.message for result in checks},
        "total": row.total if row.graded else None,
        "max": row.max_points,
        "status": row.status,
    }
