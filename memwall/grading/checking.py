"""``check(name, answer)``: what a check cell calls.

It runs the registered check on hidden cases drawn from a random generator seeded by the
check's name plus a fresh random component, so the cases change on every run and cannot be
hard-coded. Success prints one line; failure raises ``AssertionError`` with one helpful message,
which is what makes nbval (and so the grader) count the cell as failed.
"""

import os
import random
import secrets

from memwall.grading.registry import get_check

PASS_MARK = "✓"
# Set this to replay the same hidden cases, e.g. while writing a check.
SEED_VARIABLE = "MEMWALL_CHECK_SEED"


def check(name, answer, **context):
    """Grade ``answer`` (usually the student's function) with the check registered as ``name``."""
    __tracebackhide__ = True  # IPython hides this frame: students see the message, not memwall.
    spec = get_check(name)
    rng = random.Random(f"{name}:{random_component()}")
    try:
        cases = spec.function(answer, rng, **context)
    except NotImplementedError as error:
        raise AssertionError(f"{name}: not implemented yet ({error})") from None
    except AssertionError as error:
        raise AssertionError(f"{name}: {error}") from None
    except Exception as error:
        raise AssertionError(
            f"{name}: checking your answer raised {type(error).__name__}: {error}"
        ) from None
    cases = cases if isinstance(cases, int) and cases > 0 else 1
    print(f"{PASS_MARK} {name}: {cases}/{cases} cases passed")


def random_component() -> str:
    return os.environ.get(SEED_VARIABLE) or str(secrets.randbits(64))


def numpy_rng(rng):
    """A numpy Generator drawn from a check's ``rng``, for checks that need arrays."""
    import numpy as np

    return np.random.default_rng(rng.getrandbits(64))
