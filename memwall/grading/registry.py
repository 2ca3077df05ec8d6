"""The registry of exercise checks, filled on demand from the answer key (solutions/checks/).

A check named ``"ch01.ttft"`` lives in the key's module ``ch01.py`` (``answer_key.py`` finds the
key; it never ships to students), which is imported the first time one of its checks is asked
for. A check module therefore costs nothing until a notebook uses it, and adding a chapter needs
no central list.

Two ways to register a check, both served by the notebook's ``check()`` and by the grader:

- ``@register_cases(name, reference=..., rtol=..., compare=...)`` on a function
  ``cases(rng) -> list of cases``: the check is its parts, a case generator, a reference and a
  comparison. Preferred for new checks.
- ``@register(name)`` on ``function(answer, rng) -> cases passed`` that draws its own cases and
  calls ``compare_function``, for checks whose calls depend on each other.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from memwall.grading.answer_key import import_key_module
from memwall.grading.compare import DEFAULT_RTOL, compare_function, difference

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


def register_cases(name, reference, rtol=DEFAULT_RTOL, atol=0.0, compare=None, wrong_answers=()):
    """Decorator: register ``cases(rng)`` with its ``reference`` as the check called ``name``.

    Each case is a dict of keyword arguments (or a tuple of positional ones) of plain data:
    numbers, strings, lists, tuples, dicts, numpy arrays, torch tensors, and build specs
    (``memwall.exercise_driver.values.build_spec``) for objects such as a fake clock.
    ``compare(expected, got)`` returns None when ``got`` is right, else a short sentence; the
    default compares numbers to ``rtol``/``atol`` (``compare.difference``).
    """

    def decorate(cases):
        comparison = compare or (lambda expected, got: difference(expected, got, rtol, atol))

        def function(answer, rng):
            # The custom comparison only: the default one stays rtol/atol, which practice cases record.
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
