"""Flag student code that reaches for the grading machinery, for a human to review.

The points never depend on this scan: the grader judges every check in its own process
(channel.py), and the sandbox keeps memwall.grading and the references out of the student's
reach. The flags only tell the instructor that someone tried, in the status column.
"""

import re

# Searched in the code with all whitespace removed, one line at a time: plain substring tests
# and one regex without nested repetition, so the scan is linear in the code's length.
IMPORT_PATCHES = ("sys.modules", "__import__", "importlib", "builtins", "pkgutil")
IPYTHON_HOOKS = ("set_custom_exc", "input_transformers", "ast_transformers", "register_magic")
GENERATED_CODE = re.compile(r"(?<![\w.])(?:exec|eval|compile)\(")
# Starts only at a word boundary, so each word is scanned once.
REFERENCE_CALL = re.compile(r"(?<!\w)reference_\w+[ \t]*\(")


def tampering_flags(sources) -> list:
    """Short reasons, one per kind of suspicious code found in ``sources``."""
    found = set()
    for source in sources:
        for line in source.splitlines():
            _scan_line("".join(line.split()), line, found)
    order = [
        "touches memwall.grading", "redefines check", "patches imports", "runs generated code",
        "uses IPython hooks", "calls a reference",
    ]  # fmt: skip
    return [reason for reason in order if reason in found]


def _scan_line(code: str, line: str, found: set):
    if "memwall.grading" in code or (code.startswith("frommemwallimport") and "grading" in code):
        found.add("touches memwall.grading")
    if code.startswith("defcheck(") or (
        code.startswith("check=") and not code.startswith("check==")
    ):
        found.add("redefines check")
    if any(name in code for name in IMPORT_PATCHES):
        found.add("patches imports")
    if GENERATED_CODE.search(code):
        found.add("runs generated code")
    if any(name in code for name in IPYTHON_HOOKS):
        found.add("uses IPython hooks")
    if "reference_" in code and REFERENCE_CALL.search(line):
        found.add("calls a reference")
