"""Flag student code that reaches for the grading machinery, for a human to review.

Restoring the check cells already makes editing them pointless, and each check cell imports
``check`` afresh, so shadowing it does nothing. But code in a notebook runs in the same process
as the check and could, say, patch memwall.grading itself. No scan can rule that out, so this one
only raises a flag in the status column; the points stay what the run produced.
"""

import re

SUSPICIOUS = [
    (
        re.compile(r"memwall\s*\.\s*grading|from\s+memwall\s+import\s+.*\bgrading\b"),
        "touches memwall.grading",
    ),
    (re.compile(r"^\s*(def\s+check\s*\(|check\s*=[^=])", re.MULTILINE), "redefines check"),
    (re.compile(r"sys\s*\.\s*modules|__import__|importlib|\bbuiltins\b"), "patches imports"),
    # Code built at run time would slip past the patterns above.
    (re.compile(r"(?<![\w.])(exec|eval|compile)\s*\("), "runs generated code"),
]


def tampering_flags(sources) -> list:
    """Short reasons, one per kind of suspicious code found in ``sources``."""
    text = "\n".join(sources)
    return [reason for pattern, reason in SUSPICIOUS if pattern.search(text)]
