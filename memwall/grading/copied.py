"""Flag student code that is the answer key's code with the names changed, for a human to review.

Each function is reduced to a fingerprint: its syntax tree without docstrings, with every
variable and argument renamed by order of first use (``a``, ``b``... become ``v0``, ``v1``...)
and the function's own name dropped. Attribute names, constants and the shape of the code stay.
A student function whose fingerprint equals one of the key's (its ``reference_*`` functions and
the solution bodies) is flagged. Short functions (under five statements) are skipped: a formula is what every right answer
looks like, so matching it proves nothing. Code that still holds the solution notebooks' own
markers (``### BEGIN SOLUTION``) was pasted from them, whatever its length, and is flagged too.
"""

import ast
import hashlib
from pathlib import Path

from memwall.grading.cells import BEGIN_SOLUTION
from memwall.grading.syntax import parse

# Below these a function is too short to tell copying from knowing the answer: a formula of
# one or two lines is what every right answer looks like, however many terms it has.
MIN_NODES = 45
MIN_STATEMENTS = 5


def fingerprints(source: str) -> dict:
    """{fingerprint: function name} for each long enough function defined in ``source``."""
    try:
        tree = parse(source)
    except (SyntaxError, ValueError):
        return {}
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            print_ = _fingerprint(node)
            if print_ is not None:
                found.setdefault(print_, node.name)
    return found


def key_fingerprints(key_folder, solution_sources=()) -> dict:
    """Fingerprints of the key's ``reference_*`` functions and of the solutions' functions."""
    found = {}
    if key_folder is not None:
        for path in sorted(Path(key_folder).glob("*.py")):
            for print_, name in fingerprints(path.read_text()).items():
                if name.startswith("reference_"):
                    found.setdefault(print_, f"{path.stem}.{name}")
    for source in solution_sources:
        for print_, name in fingerprints(source).items():
            found.setdefault(print_, f"solution {name}")
    return found


def copied_flags(student_sources, key_prints: dict) -> list:
    """Review notes, one per student function that matches the key's code."""
    notes = []
    for source in student_sources:
        if BEGIN_SOLUTION in source:
            notes.append(f"holds the solution notebooks' marker {BEGIN_SOLUTION!r}")
        for print_, name in fingerprints(source).items():
            if print_ in key_prints:
                notes.append(f"{name} matches the answer key's {key_prints[print_]}")
    return sorted(set(notes))


class _Renamer(ast.NodeTransformer):
    def __init__(self):
        self.names = {}

    def _new(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._new(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._new(node.arg), annotation=None), node)


def _fingerprint(function):
    function = parse(ast.unparse(function)).body[0]  # a copy we may change
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    body = [statement for statement in body if not _is_not_implemented(statement)]
    if not body:
        return None
    renamer = _Renamer()
    arguments = renamer.visit(function.args)
    module = ast.Module(body=[renamer.visit(statement) for statement in body], type_ignores=[])
    nodes = list(ast.walk(module))
    statements = sum(isinstance(node, ast.stmt) for node in nodes)
    if len(nodes) < MIN_NODES or statements < MIN_STATEMENTS:
        return None
    text = ast.dump(arguments) + ast.dump(module)
    return hashlib.sha256(text.encode()).hexdigest()


def _is_not_implemented(statement) -> bool:
    return isinstance(statement, ast.Raise) and "NotImplementedError" in ast.unparse(statement)
