"""``check(name, answer)``: what a check cell calls, and ``run_check``, what the grader calls.

Both run the registered check on hidden cases drawn from a random generator with a fresh
random component, so the cases change on every run and cannot be hard-coded. In a notebook,
success prints one line and failure raises ``AssertionError`` with one helpful message, which
is what makes nbval fail the cell. The grader calls ``run_check`` in its own process, with the
student's function reached through the grading channel, and scores the verdict itself.
"""

import os
import random
import secrets
from dataclasses import dataclass

from memwall.grading.answer_key import NoAnswerKey
from memwall.grading.registry import get_check

PASS_MARK = "✓"
# Set this to replay the same hidden cases in a notebook, e.g. while writing a check. The
# grader never reads it: its cases come from grader_rng().
SEED_VARIABLE = "MEMWALL_CHECK_SEED"


@dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str  # "12/12 cases passed", or "<name>: why it failed"


def check(name, answer, **context):
    """Grade ``answer`` (usually the student's function) with the check registered as ``name``."""
    __tracebackhide__ = True  # IPython hides this frame: students see the message, not memwall.
    try:
        spec = get_check(name)
    except NoAnswerKey:  # a student's install: the precomputed practice cases instead
        return check_practice(name, answer)
    rng = random.Random(f"{name}:{random_component()}")
    verdict = run_check(spec, answer, rng, **context)
    if not verdict.passed:
        raise AssertionError(verdict.message)
    print(f"{PASS_MARK} {name}: {verdict.message}")


def check_practice(name, answer):
    """``check`` without the key: compare with the recorded practice cases (expected.py)."""
    __tracebackhide__ = True
    verdict = run_check(PracticeCheck(name), answer, None)
    if not verdict.passed:
        raise AssertionError(verdict.message)
    if verdict.message.startswith("0/"):
        print(f"{name}: no practice cases here; your instructor's grader checks this one")
        return
    print(f"{PASS_MARK} {name}: {verdict.message.replace('cases', 'practice cases')}")


@dataclass(frozen=True)
class PracticeCheck:
    """The part of a CheckSpec that run_check needs, backed by the recorded cases."""

    name: str

    def function(self, answer, rng):
        from memwall.grading.expected import replay

        count = replay(self.name, answer)
        return count if count else "none"


def run_check(spec, answer, rng, **context) -> Verdict:
    """Run one check on ``answer``; never raises for a wrong or unfinished answer."""
    name = spec.name
    try:
        cases = spec.function(answer, rng, **context)
    except NotImplementedError as error:
        return Verdict(False, f"{name}: not implemented yet ({error})")
    except AssertionError as error:
        return Verdict(False, f"{name}: {error}")
    except Exception as error:
        return Verdict(
            False, f"{name}: checking your answer raised {type(error).__name__}: {error}"
        )
    if cases == "none":
        return Verdict(True, "0/0 cases passed")
    cases = cases if isinstance(cases, int) and cases > 0 else 1
    return Verdict(True, f"{cases}/{cases} cases passed")


def random_component() -> str:
    return os.environ.get(SEED_VARIABLE) or str(secrets.randbits(64))


def grader_rng(name) -> random.Random:
    """The grader's generator for one check: fresh secret bits, no environment variable."""
    return random.Random(f"{name}:{secrets.token_hex(16)}")


def numpy_rng(rng):
    """A numpy Generator drawn from a check's ``rng``, for checks that need arrays."""
    import numpy as np

    return np.random.default_rng(rng.getrandbits(64))
