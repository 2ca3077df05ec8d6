"""Where the answer key lives: the check modules and their references, beside ``solutions/``.

The key (``solutions/checks/chNN.py``) never ships in the package a student installs: only the
instructor's checkout has it. It is imported as the package ``memwall_answer_key`` from the first
of these that exists:

1. the folder given to ``use_key`` (``memwall grade`` passes ``<solutions>/checks``);
2. the folder named by ``$MEMWALL_ANSWER_KEY``;
3. ``solutions/checks`` in the working folder or one of its parents (a checkout: CI, the
   instructor's own runs of the solution notebooks).

Without a key, a check cell in a student's notebook replays the precomputed cases of
``memwall/grading/expected/`` instead (``expected.py``).
"""

import importlib
import os
import sys
import types
from pathlib import Path

KEY_PACKAGE = "memwall_answer_key"
KEY_VARIABLE = "MEMWALL_ANSWER_KEY"
KEY_IN_CHECKOUT = Path("solutions") / "checks"

_chosen = None


class NoAnswerKey(LookupError):
    """The answer key is not here (a student's install): only precomputed cases can be checked."""


def use_key(folder):
    """Load the key from ``folder`` from now on (the grader calls this with <solutions>/checks)."""
    global _chosen
    folder = Path(folder).resolve()
    if not (folder / "__init__.py").is_file():
        raise NoAnswerKey(f"no answer key in {folder} (expected {folder}/__init__.py)")
    if _chosen != folder:
        _forget_loaded_key()
        _chosen = folder


def key_folder():
    """The folder of the answer key, or None where there is none (a student's install)."""
    if _chosen is not None:
        return _chosen
    named = os.environ.get(KEY_VARIABLE)
    candidates = [Path(named)] if named else []
    here = Path.cwd()
    candidates += [folder / KEY_IN_CHECKOUT for folder in (here, *here.parents)]
    for folder in candidates:
        if (folder / "__init__.py").is_file():
            return folder.resolve()
    return None


def import_key_module(prefix: str):
    """The key's module for one chapter (``"ch01"``); NoAnswerKey or LookupError if missing."""
    folder = key_folder()
    if folder is None:
        raise NoAnswerKey("the answer key is not installed here (it stays with the instructor)")
    package = sys.modules.get(KEY_PACKAGE)
    if package is None or list(getattr(package, "__path__", [])) != [str(folder)]:
        _forget_loaded_key()
        package = types.ModuleType(KEY_PACKAGE)
        package.__path__ = [str(folder)]
        sys.modules[KEY_PACKAGE] = package
    module_name = f"{KEY_PACKAGE}.{prefix}"
    if not (folder / f"{prefix}.py").is_file():
        raise LookupError(f"no check module {prefix}.py in the answer key {folder}")
    return importlib.import_module(module_name)


def _forget_loaded_key():
    for name in [n for n in sys.modules if n == KEY_PACKAGE or n.startswith(KEY_PACKAGE + ".")]:
        del sys.modules[name]


# What a solution notebook's widget cell calls: key_module("ch01").reference_tpot.
key_module = import_key_module
