"""The registry of exercise checks, filled on demand from memwall/grading/checks/.

A check named ``"ch01.ttft"`` lives in the module ``memwall.grading.checks.ch01``, which is
imported the first time one of its checks is asked for. A check module therefore costs nothing
until a notebook uses it, and adding a chapter needs no central list.
"""

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

CHECKS_PACKAGE = "memwall.grading.checks"

_REGISTRY = {}


@dataclass(frozen=True)
class CheckSpec:
    name: str
    # Called as function(answer, rng, **context); returns how many hidden cases passed.
    function: Callable
    # Answers a careless student might give; CI proves the check rejects each of them.
    wrong_answers: tuple = field(default=())


def register(name, wrong_answers=()):
    """Decorator: register ``function(answer, rng, **context)`` as the check called ``name``."""

    def decorate(function):
        if name in _REGISTRY and _REGISTRY[name].function.__qualname__ != function.__qualname__:
            raise ValueError(f"check {name!r} is registered twice")
        _REGISTRY[name] = CheckSpec(name, function, tuple(wrong_answers))
        return function

    return decorate


def get_check(name) -> CheckSpec:
    """The check called ``name``, importing its chapter's module if needed."""
    if name not in _REGISTRY:
        prefix = name.split(".", 1)[0]
        module_name = f"{CHECKS_PACKAGE}.{prefix}"
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            raise LookupError(f"no check module {module_name} for check {name!r}") from None
    if name not in _REGISTRY:
        known = sorted(n for n in _REGISTRY if n.startswith(name.split(".", 1)[0] + "."))
        raise LookupError(f"no check named {name!r}; registered in that module: {known}")
    return _REGISTRY[name]
