"""The registry of exercise checks, filled on demand from the answer key (solutions/checks/).

A check named ``"ch01.ttft"`` lives in the key's module ``ch01.py`` (``answer_key.py`` finds the
key; it never ships to students), which is imported the first time one of its checks is asked
for. A check module therefore costs nothing until a notebook uses it, and adding a chapter needs
no central list.

One way to register a check, served by the notebook's ``check()`` and by the grader, and an
escape hatch:

- ``@register_cases(name, reference=..., rtol=..., compare=..., measured=...)`` on a function
  ``cases(rng) -> list of cases``: the check is its parts, a case generator, a reference and a
  comparison. Every check of the course but one is registered so.
- ``@register(name)`` on ``function(answer, rng) -> cases passed`` that draws its own cases and
  calls ``compare_function``: only for a check that compares something built from the student's
  function (``ch05.mean_pool_heads``), which has no practice cases for that reason.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from memwall.grading.answer_key import import_key_module
from memwall.grading.compare import DEFAULT_RTOL, compare_function, difference
from memwall.grading.measured_compare import compare_measured

_REGISTRY = {}


@dataclass(frozen=True)
class CheckSpec:
    name: str
    # Called as function(answer, rng, **context); returns how many hidden cases passed and
    # raises AssertionError (or NotImplementedError) otherwise.
    function: Callable
    # Answers a careless student might give; CI proves the check rejects each of them.
    wrong_answers: tuple = field(default=())
    # The parts of a check registered with register_cases (None for register):
    cases: Callable = None  # cases(rng) -> list of cases of plain data
    reference: Callable = None  # reference(*args, **kwargs) -> the right result
    compare: Callable = None  # compare(expected, got) -> None, or what differs


def register(name, wrong_answers=()):
    """Decorator: register ``function(answer, rng, **context)`` as the check called ``name``."""

    def decorate(function):
        _add(CheckSpec(name, function, tuple(wrong_answers)))
        return function

    return decorate


def register_cases(name, reference, rtol=DEFAULT_RTOL, atol=0.0, compare=None, wrong_answers=(),
                   measured=False):  # fmt: skip
    """Decorator: register ``cases(rng)`` with its ``reference`` as the check called ``name``.

    Each case is a dict of keyword arguments (or a tuple of positional ones) of plain data:
    numbers, strings, lists, tuples, dicts, numpy arrays, torch tensors, and build specs
    (``memwall.exercise_driver.values.build_spec``) for objects such as a fake clock.
    ``compare(expected, got)`` returns None when ``got`` is right, else a short sentence; the
    default compares numbers to ``rtol``/``atol`` (``compare.difference``). ``measured=True``
    for an exercise whose function times a fake bench (``memwall.fakeclock.bench_spec`` in the
    case): the bench is built where the function is called and ``reference(**case)`` computes
    the truth from the spec (``measured_compare.compare_measured``).
    """

    def decorate(cases):
        comparison = compare or (lambda expected, got: difference(expected, got, rtol, atol))

        def function(answer, rng):
            if measured:
                return compare_measured(answer, reference, cases(rng), rtol, atol)
            # The custom comparison only: the default stays rtol/atol, which practice cases record.
            return compare_function(answer, reference, cases(rng), rtol, atol, compare=compare)

        function.__qualname__ = f"{getattr(cases, '__qualname__', name)}.check"
        _add(CheckSpec(name, function, tuple(wrong_answers), cases, reference, comparison))
        return cases

    return decorate


def _add(spec):
    known = _REGISTRY.get(spec.name)
    if known is not None and known.function.__qualname__ != spec.function.__qualname__:
        raise ValueError(f"check {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec


def get_check(name) -> CheckSpec:
    """The check called ``name``, importing its chapter's module from the key if needed.

    Raises ``answer_key.NoAnswerKey`` where the key is absent, LookupError for an unknown name.
    """
    if name not in _REGISTRY:
        import_key_module(name.split(".", 1)[0])
    if name not in _REGISTRY:
        known = sorted(n for n in _REGISTRY if n.startswith(name.split(".", 1)[0] + "."))
        raise LookupError(f"no check named {name!r}; registered in that module: {known}")
    return _REGISTRY[name]


def registered_names(prefix: str) -> list:
    """The names of the checks registered so far whose module is ``prefix`` (``"ch01"``)."""
    return sorted(name for name in _REGISTRY if name.split(".", 1)[0] == prefix)
