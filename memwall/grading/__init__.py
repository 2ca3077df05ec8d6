"""Exercises and grading: checks for students, a grader for instructors.

The exercise format
===================
``solutions/NN_slug.md`` (MyST Markdown) is the single source of truth; ``exercises/NN_slug.ipynb``
is generated from it by ``memwall notebooks`` (``memwall exercises`` is the same generator,
for exercises/ only) and never edited by hand. A solution notebook holds, for each exercise,
three kinds of cells (nbformat 4.5, so every cell has an id):

1. An **exercise cell** (code). Cell metadata ``{"memwall": {"solution": "ch01.ttft",
   "hint": "what grows with the prompt?"}}``; the answer sits between
   ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines (the nbgrader markers). The student copy
   replaces each span with ``raise NotImplementedError("Exercise N: <hint>")`` at the marker's
   indentation, so put the markers inside a function body. Start the cell with the ``def`` line:
   the grader uses it to find the cell when an editor drops the metadata.
2. Usually a **widget cell** that plots the student's function next to the reference
   (``memwall.widgets.compare_plot(fn, key_module("ch01").reference_ttft, ...)``); it shows
   "not implemented yet" for a blank exercise. The student copy draws the reference from curves
   recorded by ``memwall notebooks`` (``memwall.widgets.recorded``), never from the key.
3. A **check cell**. Cell metadata ``{"memwall": {"check": "ch01.ttft", "points": 2}}``, source::

       from memwall.grading import check
       check("ch01.ttft", ttft_ms)

   The cell imports ``check`` itself, so a student's own ``check = ...`` is overridden. Never tag
   it ``raises-exception``: nbval would then pass a blank exercise.

Each chapter has at least three check cells. ``validate_solution(nb)`` lists what breaks these
rules. A hint names the idea or the quantity to look at, never the finished expression.

Writing a check
===============
The check named ``"ch01.ttft"`` lives in the answer key, ``solutions/checks/ch01.py``, which
never ships in the package (``answer_key.py`` finds it beside the solutions); the prefix names
the module. A check is three parts: a **case generator**, a **reference** and a
**comparison**::

    from memwall.grading.registry import register_cases

    def reference_ttft(prompt_tokens, tokens_per_second):  # in solutions/checks/ch01.py
        return prompt_tokens / tokens_per_second * 1000

    @register_cases("ch01.ttft", reference=reference_ttft, rtol=1e-6,
                    wrong_answers=[lambda prompt_tokens, tokens_per_second: prompt_tokens / tokens_per_second])
    def cases_ttft(rng):
        return [dict(prompt_tokens=rng.randint(1, 8192), tokens_per_second=rng.uniform(100, 5000))
                for _ in range(12)]

``get_check(name)`` returns a ``CheckSpec`` with ``cases(rng)``, ``reference``, ``compare``
(``compare(expected, got)`` -> None or what differs; default ``compare.difference`` with
``rtol``/``atol``) and ``function(answer, rng)``, which runs them all. ``measured=True`` is
for an exercise whose function times a fake bench (``memwall.fakeclock.bench_spec``). Every
check is registered this way but one: a check that compares something built from the student's
function (``ch05.mean_pool_heads``: attention after their pooling) decorates
``function(student, rng)`` with ``@register(name)`` and calls ``compare_function`` itself.

A case is a dict of keyword arguments, a tuple of positional ones, or one value, made of plain
data (``memwall.exercise_driver.values``): numbers, strings, lists, tuples, dicts, numpy arrays,
torch tensors, and **build specs** for arguments that must be objects::

    from memwall.exercise_driver.values import build_spec
    dict(workload=build_spec("fake_clock_workload", step_times_s=[0.4, 0.01, 0.011]))

Whichever side calls a function builds the spec with the builder of that name
(``memwall.exercise_driver.builders``; register one with ``@builder("name")`` in a module listed
in ``BUILDER_MODULES``; it holds no answers, students can read it). So the reference and the
student's function see the same fake clock or workload, in the notebook and under the grader.
``solutions/checks/demo.py`` is a worked example, measured check included (``demo.mean_step_s``).

Results may be numbers (two ints must be equal exactly), lists, tuples, dicts, numpy arrays or
torch tensors. ``check`` turns the verdict into one line, ``✓ ch01.ttft: 12/12 cases passed``,
or an ``AssertionError`` prefixed with the check name; a ``NotImplementedError`` from the
student's function becomes "not implemented yet". ``wrong_answers`` are answers the check must
reject: tests/test_exercises_sync.py proves it does. Import heavy modules inside the functions.

Grading
=======
``grade(submissions_dir, out_csv, feedback_dir=None, timeout=900, cell_timeout=300, jobs=1,
solutions_dir="solutions", sandbox="auto", call_timeout=None)`` (the `memwall grade` command)
rebuilds each submission on its solution's skeleton (``restore.py``), turns each check cell into
``serve(name, answer)`` (``serve_cells.py``, ``memwall.exercise_driver.driver``) and runs the
notebook under ``pytest --nbval-lax`` in a bubblewrap sandbox (``execute.py``, ``sandbox.py``)
that has neither ``memwall.grading`` nor ``solutions/``. Points are decided outside the
student's process: for each served check the grader draws the hidden cases itself, calls the
student's function through a Unix socket (plain data in, a plain value out, a per-call time
limit) and compares with the reference in its own process (``channel.py``, ``checking.py``).
The per-cell records from inside the run only explain a zero (``scoring.py``). It reads what
the run leaves defensively (``safe_files.py``) and writes one CSV row per notebook plus a
feedback file (``report.py``), atomically, as rows finish. ``exercises`` and ``grade`` are
plugged into the `memwall` command by ``cli.register_cli``. See book/instructors.md.
"""

from memwall.grading.checking import check, numpy_rng
from memwall.grading.compare import compare_function, compare_value
from memwall.grading.registry import get_check, register, register_cases

__all__ = [
    "check",
    "compare_function",
    "compare_value",
    "get_check",
    "grade",
    "make_student_copy",
    "numpy_rng",
    "register",
    "register_cases",
    "register_cli",
    "sync_exercises",
    "validate_solution",
]

# The instructor-side tools load nbformat; a check cell should not pay for that.
_LAZY = {
    "grade": "memwall.grading.grader",
    "make_student_copy": "memwall.grading.student_copy",
    "register_cli": "memwall.grading.cli",
    "sync_exercises": "memwall.grading.sync",
    "validate_solution": "memwall.grading.solution_format",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memwall.grading' has no attribute {name!r}")
