"""Builders: turn a plain-data spec into the object an exercise function receives.

A "measured" exercise hands the student's function an object, say a fake clock and a workload
to time with it. Objects cannot cross the grading channel, so a check's case holds a *build
spec* instead (``values.build_spec("fake_clock_workload", step_times_s=[...])``), and the side
that calls the function, the student's kernel or the check itself, builds it here. Both sides
run this same code, so the reference sees the same object the student's function sees.

Add a builder with ``@builder("name")`` in a module with no answers in it (the student can
read it; ``memwall.fakeclock`` holds the fake clocks) and list that module in ``BUILDER_MODULES`` so it is imported on demand.
"""

import importlib

# Modules that register builders when imported (a missing one is skipped).
BUILDER_MODULES = ("memwall.fakeclock",)

_BUILDERS = {}


def builder(name):
    """Decorator: register ``function(spec) -> object`` as the builder called ``name``."""

    def decorate(function):
        _BUILDERS[name] = function
        return function

    return decorate


def build(name: str, spec):
    """The object the builder ``name`` makes from ``spec`` (a dict of plain data)."""
    if name not in _BUILDERS:
        for module in BUILDER_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as error:
                if error.name != module:
                    raise
    if name not in _BUILDERS:
        raise ValueError(f"no builder {name[:60]!r}; known: {sorted(_BUILDERS)}")
    if not isinstance(spec, dict):
        raise ValueError(f"builder {name!r} needs a dict spec, got {type(spec).__name__}")
    return _BUILDERS[name](spec)
