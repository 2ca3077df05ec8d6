"""Exercises and grading: checks for students, a grader for instructors.

The exercise format
===================
``solutions/NN_slug.ipynb`` is the single source of truth; ``exercises/NN_slug.ipynb`` is
generated from it by ``memwall exercises`` and never edited by hand. A solution notebook holds,
for each exercise, three kinds of cells (nbformat 4.5, so every cell has an id):

1. An **exercise cell** (code). Cell metadata ``{"memwall": {"solution": "ch01.ttft",
   "hint": "prefill time grows with the prompt"}}``; the answer sits between
   ``### BEGIN SOLUTION`` and ``### END SOLUTION`` lines (the nbgrader markers). The student copy
   replaces each span with ``raise NotImplementedError("Exercise N: <hint>")`` at the marker's
   indentation, so put the markers inside a function body. Start the cell with the ``def`` line:
   the grader uses it to find the cell when an editor drops the metadata.
2. Usually a **widget cell** that plots the student's function next to memwall's
   (``memwall.widgets.compare_plot``); it shows "not implemented yet" for a blank exercise.
3. A **check cell**. Cell metadata ``{"memwall": {"check": "ch01.ttft", "points": 2}}``, source::

       from memwall.grading import check
       check("ch01.ttft", ttft_ms)

   The cell imports ``check`` itself, so a student's own ``check = ...`` is overridden. Never tag
   it ``raises-exception``: nbval would then pass a blank exercise.

Each chapter has at least three check cells. ``validate_solution(nb)`` lists what breaks these
rules.

Writing a check
===============
The check named ``"ch01.ttft"`` lives in ``memwall/grading/checks/ch01.py`` and is found
automatically from the prefix. It receives the student's answer, a ``random.Random`` seeded from
the check name plus a fresh random component, and any keyword arguments the check cell passes::

    from memwall.grading import compare_function, register

    def reference_ttft(prompt_tokens, tokens_per_second):
        return prompt_tokens / tokens_per_second * 1000

    @register("ch01.ttft", wrong_answers=[lambda prompt_tokens, tokens_per_second: prompt_tokens / tokens_per_second])
    def check_ttft(student, rng):
        cases = [dict(prompt_tokens=rng.randint(1, 8192), tokens_per_second=rng.uniform(100, 5000))
                 for _ in range(12)]
        return compare_function(student, reference_ttft, cases, rtol=1e-6)

``compare_function(student, reference, cases, rtol=1e-6, atol=0.0)`` and
``compare_value(answer, expected, rtol=1e-6, atol=0.0, what="your answer")`` return the number of
cases that passed and raise ``AssertionError`` naming the first failing input, the expected and
the actual result. A case is a dict of keyword arguments, a tuple of positional ones, or one
value; results may be numbers (two ints must be equal exactly), lists, dicts, numpy arrays or
torch tensors. ``check`` turns that into one line, ``✓ ch01.ttft: 12/12 cases passed``, or an
``AssertionError`` prefixed with the check name; a ``NotImplementedError`` from the student's
function becomes "not implemented yet". ``wrong_answers`` are answers the check must reject:
tests/test_exercises_sync.py proves it does. Import heavy modules inside the check function.
``checks/demo.py`` is a complete example.

Grading
=======
``grade(submissions_dir, out_csv, feedback_dir=None, timeout=900, cell_timeout=300, jobs=1,
solutions_dir="solutions")`` (the `memwall grade` command) rebuilds each submission on its
solution's skeleton (``restore.py``), runs it with ``pytest --nbval-lax`` in a fresh kernel with
cell and wall-clock limits (``execute.py``, ``nbval_plugin.py``, results signed by
``signing.py``), scores each check cell that passed and printed its ``✓`` line (``grader.py``)
and writes one CSV row per notebook plus a feedback file (``report.py``). ``exercises`` and
``grade`` are plugged into the `memwall` command by ``cli.register_cli``. See
book/instructors.md.
"""

from memwall.grading.checking import check, numpy_rng
from memwall.grading.compare import compare_function, compare_value
from memwall.grading.registry import get_check, register

__all__ = [
    "check",
    "compare_function",
    "compare_value",
    "get_check",
    "grade",
    "make_student_copy",
    "numpy_rng",
    "register",
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
    "validate_solution": "memwall.grading.validate",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memwall.grading' has no attribute {name!r}")
