"""Student names and file names made safe to show, to write into a CSV and to use as file names.

A submission's name comes from a file system the student (or a zip tool) chose: it may be
longer than a file name may be once a suffix is added, not UTF-8 at all (a Latin-1 "José"
from a zip arrives as surrogate escapes), or hold escape codes that would drive the
instructor's terminal. ``readable`` gives the text to show and store, ``printable`` strips what a
terminal or a spreadsheet would act on, and ``feedback_file_name`` gives a short, portable,
unique file name.
"""

import hashlib
import re
import unicodedata

MAX_NAME_CHARACTERS = 120
# Bytes, not characters: Linux limits a file name to 255 bytes, and the name gets a suffix.
MAX_FILE_NAME_BYTES = 150
# C0 and C1 controls, DEL, and the bidirectional overrides that can make a name read backwards.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
UNSAFE_IN_FILE_NAME = re.compile(r"[^\w.\-]+")


def readable(name: str) -> str:
    """A file name as text: undecodable bytes read as Latin-1, NFC, no controls, length-capped."""
    raw = name.encode("utf-8", "surrogateescape")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # what a zip from an older system usually holds
    text = printable(unicodedata.normalize("NFC", text))
    if len(text) > MAX_NAME_CHARACTERS:
        text = f"{text[: MAX_NAME_CHARACTERS - 10]}…{_digest(raw)[:8]}"
    return text


def printable(text: str) -> str:
    """``text`` without control characters (escape codes, carriage returns, bidi overrides)."""
    return CONTROL.sub("?", str(text).replace("\n", " ").replace("\t", " "))


def printable_lines(text: str) -> str:
    """Like ``printable``, keeping line breaks (for feedback files)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def feedback_file_name(student: str, chapter: str) -> str:
    """``student__chapter.txt`` with only letters, digits, ``_ . -``, at most MAX_FILE_NAME_BYTES."""
    stem = UNSAFE_IN_FILE_NAME.sub("_", f"{student}__{chapter}").strip("._") or "submission"
    if len(stem.encode()) + 4 > MAX_FILE_NAME_BYTES:
        digest = _digest(stem.encode())[:10]
        cut = stem.encode()[: MAX_FILE_NAME_BYTES - 16].decode("utf-8", "ignore")
        stem = f"{cut}-{digest}"
    return f"{stem}.txt"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
