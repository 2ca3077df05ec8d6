"""Practice cases with precomputed answers: how a check cell works where the key is absent.

A student's install has no answer key (``answer_key.py``), so ``check()`` cannot compute the
right result. ``memwall notebooks`` (``record_chapter``) runs each check once against the key,
on a fixed generator, and writes every case the check compares together with the reference's
result to ``memwall/grading/expected/chNN.json``: data, not code. ``replay`` compares a
student's function with those results, with the check's own tolerances. The hidden, random
cases stay with the grader, so learning the practice answers by heart earns nothing.

Only cases that go through ``compare_function`` or ``compare_measured`` with the default
comparison and call the answer itself are recorded; a check that compares in its own way has
fewer (or no) practice cases, and its check cell says so.
"""

import json
import random
from pathlib import Path

from memwall.exercise_driver.values import from_plain, to_plain
from memwall.grading import compare as compare_module
from memwall.grading import measured_compare

EXPECTED_DIR = Path(__file__).resolve().parent / "expected"
PRACTICE_SEED = "practice"
# Enough cases to catch a wrong idea; few and small enough to keep the package small.
MAX_CASES = 6
MAX_CASE_CHARACTERS = 12_000


def expected_path(prefix: str) -> Path:
    return EXPECTED_DIR / f"{prefix}.json"


def load_expected(name: str) -> list:
    """The recorded cases of check ``name`` ([] when none were recorded)."""
    path = expected_path(name.split(".", 1)[0])
    if not path.is_file():
        return []
    return json.loads(path.read_text()).get(name, [])


def replay(name: str, answer) -> int:
    """Compare ``answer`` with the recorded results; the number of cases, or AssertionError."""
    __tracebackhide__ = True
    passed = 0
    for recorded in load_expected(name):
        expected = from_plain(recorded["expected"])
        case = from_plain(recorded["case"], allow_build="keep")
        rtol, atol = recorded["rtol"], recorded["atol"]
        if recorded["kind"] == "measured":
            passed += measured_compare.compare_measured(
                answer, _constant(expected), [case], rtol, atol
            )
        else:
            passed += compare_module.compare_function(
                answer, _constant(expected), [case], rtol, atol
            )
    return passed


def _constant(value):
    def recorded_result(*args, **kwargs):
        return value

    return recorded_result


def record_check(spec) -> list:
    """Run ``spec`` once against the key on the practice generator; the cases it compared."""
    recorded = []

    def by_function(student, reference, cases, rtol=compare_module.DEFAULT_RTOL, atol=0.0,
                    compare=None):  # fmt: skip
        cases = list(cases)
        # Only cases where the answer itself is called: a check that wraps it (attention after
        # the student's pooling) compares something a replay could not rebuild.
        if compare is None and student is unfinished:
            for case in cases:
                args, kwargs = compare_module.split_case(case)
                expected = reference(*compare_module.fresh(args), **compare_module.fresh(kwargs))
                recorded.append(_entry("function", case, expected, rtol, atol))
        return len(cases)

    def measured(student, reference, cases, rtol, atol=0.0):
        cases = list(cases)
        for case in cases if student is unfinished else ():
            recorded.append(_entry("measured", case, reference(**case), rtol, atol))
        return len(cases)

    def unfinished(*args, **kwargs):
        raise NotImplementedError("recording")

    with _patched({"compare_function": by_function, "compare_measured": measured}):
        try:
            spec.function(unfinished, random.Random(f"{spec.name}:{PRACTICE_SEED}"))
        except (NotImplementedError, AssertionError):
            pass  # a check that calls the answer itself: keep the cases recorded before
    small = [entry for entry in recorded if len(json.dumps(entry)) <= MAX_CASE_CHARACTERS]
    return small[:MAX_CASES]


def record_chapter(names) -> dict:
    """{check name: recorded cases} for the checks of one chapter (needs the key)."""
    from memwall.grading.registry import get_check

    return {name: record_check(get_check(name)) for name in names}


def _entry(kind, case, expected, rtol, atol) -> dict:
    return {
        "kind": kind,
        "case": to_plain(case),
        "expected": to_plain(expected),
        "rtol": float(rtol),
        "atol": float(atol),
    }


class _patched:
    """Replace the comparison helpers in every loaded module that imported them by name."""

    def __init__(self, replacements):
        self.replacements, self.undo = replacements, []

    def __enter__(self):
        import sys

        originals = {
            "compare_function": compare_module.compare_function,
            "compare_measured": measured_compare.compare_measured,
        }
        for module in list(sys.modules.values()):
            for name, replacement in self.replacements.items():
                if getattr(module, name, None) is originals[name]:
                    self.undo.append((module, name, originals[name]))
                    setattr(module, name, replacement)
        return self

    def __exit__(self, *exc):
        for module, name, original in self.undo:
            setattr(module, name, original)
