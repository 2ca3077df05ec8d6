"""Turn the check cells of the notebook to grade into ``serve`` cells for the grading channel.

A solution's check cell reads ``check("ch01.ttft", ttft_ms)``. For grading it becomes::

    from memwall.exercise_driver.driver import serve
    serve("ch01.ttft", ttft_ms)

so the student's kernel only hands ``ttft_ms`` to the grader, which judges it. The expression
for the answer comes from the solution's own cell (trusted), parsed with ``ast``.
"""

import ast
import json

from memwall.grading.cells import check_name, code_cells
from memwall.grading.student_copy import cell_source
from memwall.grading.syntax import parse

UNCONVERTIBLE = 'raise RuntimeError("memwall grader: this check cell could not be converted")\n'


def serve_source(check_source: str, name: str) -> str:
    """The serve cell for a check cell that calls ``check(name, answer)``."""
    answer = answer_expression(check_source, name)
    if answer is None:
        return UNCONVERTIBLE
    return (
        f"from memwall.exercise_driver.driver import serve\nserve({json.dumps(name)}, {answer})\n"
    )


def answer_expression(source: str, name: str):
    """The source of ``answer`` in the cell's ``check(name, answer)`` call, or None."""
    try:
        tree = parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "check"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == name
        ):
            return ast.get_source_segment(source, node.args[1])
    return None


def serve_checks(nb):
    """``nb`` with every check cell's source replaced by its serve cell (in place); returns nb."""
    for cell in code_cells(nb):
        name = check_name(cell)
        if name is not None:
            cell["source"] = serve_source(cell_source(cell), name)
            cell["outputs"], cell["execution_count"] = [], None
    return nb
