"""Reading what a student's run left behind, and writing the grader's own files, safely.

Whatever the student's code could touch (its scratch folder, its submission) may be a symbolic
link, a FIFO that blocks a reader forever, a device, or a gigantic file. ``read_regular`` opens
without following links and without blocking, accepts regular files only, and reads at most a
given number of bytes. ``write_atomically`` writes a sibling temporary file and renames it over
the target, so a reader sees the old file or the new one, never half of one.
"""

import os
import stat
import tempfile
from pathlib import Path


class UnsafeFile(OSError):
    """Not a regular file, a link, or over the size limit."""


def read_regular(path, max_bytes: int, tail=False) -> bytes:
    """The bytes of a regular file (its last ``max_bytes`` when ``tail``); raises UnsafeFile."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if Path(path).is_symlink():
            raise UnsafeFile(f"{Path(path).name} is a symbolic link") from None
        raise error
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{Path(path).name} is not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > max_bytes:
            if not tail:
                raise UnsafeFile(f"{Path(path).name} is over {max_bytes} bytes")
            handle.seek(info.st_size - max_bytes)
        return handle.read(max_bytes)


def write_atomically(path, text: str):
    """Replace ``path`` with ``text`` (UTF-8) in one rename; refuses a directory or a link there."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ValueError(f"{path} exists and is not a regular file; remove it or choose another")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
