"""Helpers that make a check about ten lines: compare a student's answer with a reference.

``compare_function`` calls the student's function and the reference on the same hidden cases
and stops at the first case that differs, naming its input, the expected and the actual result.
``compare_value`` does the same for a single value. Both raise ``AssertionError`` on a wrong
answer and let ``NotImplementedError`` through, which ``check`` reports as "not implemented yet".
"""

import copy
import math
import numbers

from memwall.exercise_driver.values import build_arguments, is_build_spec

# A student's answer is rarely bit-identical to the reference (another summation order,
# float vs int), so "equal" means equal to about six significant digits by default.
DEFAULT_RTOL = 1e-6
SHOWN_CHARACTERS = 120


def compare_function(student, reference, cases, rtol=DEFAULT_RTOL, atol=0.0, compare=None) -> int:
    """Check ``student(*case) == reference(*case)`` for every case; return the number of cases.

    A case is a dict of keyword arguments, a tuple of positional arguments, or a single argument.
    Build specs in a case (exercise_driver.values.build_spec) become objects for both functions.
    ``compare(expected, got)`` returns None or what differs; by default ``difference`` with
    ``rtol`` and ``atol``. A student function served over the grading channel (it has
    ``call_plain``) gets plain data, and stand-ins for the built objects, which stay here.
    """
    __tracebackhide__ = True  # IPython hides this frame, so students see the message only.
    if not callable(student):
        raise AssertionError(f"expected a function, got {describe_type(student)} {show(student)}")
    compare = compare or (lambda expected, got: difference(expected, got, rtol, atol))
    cases = list(cases)
    for number, case in enumerate(cases, 1):
        args, kwargs = split_case(case)
        expected = reference(*fresh(args), **fresh(kwargs))
        call = describe_call(student, args, kwargs)
        try:
            # Copies, so a student function that mutates its input cannot change the case.
            if hasattr(student, "call_plain"):
                got = student.call_plain(fresh(args), fresh(kwargs))
            else:
                got = student(*fresh(args), **fresh(kwargs))
        except NotImplementedError:
            raise
        except Exception as error:
            raise AssertionError(f"{call} raised {type(error).__name__}: {error}") from None
        problem = compare(expected, got)
        if problem:
            raise AssertionError(
                f"wrong answer for {call}: {problem} (case {number} of {len(cases)})"
            )
    return len(cases)


def fresh(arguments):
    """A deep copy of a case's arguments with its build specs built."""
    return build_arguments(copy.deepcopy(arguments))


def compare_value(answer, expected, rtol=DEFAULT_RTOL, atol=0.0, what="your answer") -> int:
    """Check one value; return 1 (one case passed)."""
    __tracebackhide__ = True
    problem = difference(expected, answer, rtol, atol)
    if problem:
        raise AssertionError(f"{what} is wrong: {problem}")
    return 1


def difference(expected, got, rtol=DEFAULT_RTOL, atol=0.0, where=""):
    """None when ``got`` matches ``expected``, else a sentence saying how it differs."""
    prefix = f"{where}: " if where else ""
    if is_array(expected) or is_array(got):
        return _array_difference(expected, got, rtol, atol, prefix)
    if isinstance(expected, bool) or isinstance(got, bool):
        same = type(expected) is type(got) and expected == got
        return None if same else _differs(prefix, expected, got)
    if isinstance(expected, numbers.Number) and not isinstance(expected, complex):
        if not isinstance(got, numbers.Number) or isinstance(got, complex):
            return f"{prefix}expected a number ({show(expected)}), got {describe_type(got)} {show(got)}"
        return None if numbers_close(expected, got, rtol, atol) else _differs(prefix, expected, got)
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)):
            return f"{prefix}expected a {type(expected).__name__} of {len(expected)} items, got {describe_type(got)} {show(got)}"
        if len(got) != len(expected):
            return f"{prefix}expected {len(expected)} items, got {len(got)}: {show(got)}"
        for index, (want, have) in enumerate(zip(expected, got)):
            problem = difference(want, have, rtol, atol, f"{where}[{index}]")
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{prefix}expected a dict, got {describe_type(got)} {show(got)}"
        if set(got) != set(expected):
            return (
                f"{prefix}expected keys {sorted(map(str, expected))}, got {sorted(map(str, got))}"
            )
        for key in expected:
            problem = difference(expected[key], got[key], rtol, atol, f"{where}[{key!r}]")
            if problem:
                return problem
        return None
    return None if expected == got else _differs(prefix, expected, got)


def numbers_close(expected, got, rtol=DEFAULT_RTOL, atol=0.0) -> bool:
    if isinstance(expected, numbers.Integral) and isinstance(got, numbers.Integral):
        # Counts (bytes, tokens) are exact: off by one is wrong, however large the count.
        return abs(int(expected) - int(got)) <= atol
    expected, got = float(expected), float(got)
    if math.isnan(expected) or math.isnan(got):
        return math.isnan(expected) and math.isnan(got)
    return math.isclose(expected, got, rel_tol=rtol, abs_tol=atol)


def _array_difference(expected, got, rtol, atol, prefix):
    import numpy as np  # only checks about arrays pay for numpy

    want, have = as_numpy(expected), as_numpy(got)
    if have.shape != want.shape:
        return f"{prefix}expected shape {tuple(want.shape)}, got {tuple(have.shape)}"
    try:
        close = np.allclose(have, want, rtol=rtol, atol=atol, equal_nan=True)
    except TypeError:
        close = bool(np.all(have == want))
    if close:
        return None
    worst = np.unravel_index(np.argmax(np.abs(have - want)), want.shape) if want.size else ()
    return (
        f"{prefix}arrays differ, e.g. at index {tuple(int(i) for i in worst)}: "
        f"expected {show(want[worst])}, got {show(have[worst])}"
    )


def is_array(value) -> bool:
    return hasattr(value, "__array__") and not isinstance(value, numbers.Number)


def as_numpy(value):
    import numpy as np

    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    return np.asarray(value)


def split_case(case):
    if isinstance(case, dict):
        return (), case
    if isinstance(case, tuple):
        return case, {}
    return (case,), {}


def describe_call(function, args, kwargs) -> str:
    name = getattr(function, "__name__", "your function")
    shown = [show(arg) for arg in args] + [f"{key}={show(value)}" for key, value in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def describe_type(value) -> str:
    return type(value).__name__


def show(value) -> str:
    """A short, readable repr: floats to 6 significant digits, long reprs cut."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if is_build_spec(value):
        return f"<{value['builder']}>"
    if isinstance(value, (list, tuple)) and all(isinstance(item, float) for item in value):
        inner = ", ".join(f"{item:.6g}" for item in value)
        text = f"[{inner}]" if isinstance(value, list) else f"({inner})"
    else:
        text = repr(value)
    return text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 3] + "..."


def _differs(prefix, expected, got):
    return f"{prefix}expected {show(expected)}, got {show(got)}"
