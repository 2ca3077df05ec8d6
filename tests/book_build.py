"""Build the book once per test session; tests/test_book.py and tests/test_browser.py share it.

`built_book()` runs `jupyter-book build . -W --keep-going --all` into `_build/` (chapter
executions are cached in `_build/.jupyter_cache`, so unchanged chapters are not rerun) and keeps
the log in `_build/book-build.log`, ending with an "exit status N" line (the Makefile's `book`
target writes the same log). With MEMWALL_REUSE_BUILD=1 a build whose log is newer than every
source file is reused instead.

Run as a script to build a *partial* book while chapters are still being written:
`python tests/book_build.py --partial` copies the book to a temporary folder, drops the table of
contents entries whose files do not exist yet, builds there and prints the warnings (expect
"cross-reference target not found" for links to the missing pages). Executed chapters are cached
in the temp folder between partial builds; `--no-execute` skips execution altogether.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO / "_build"
HTML_DIR = BUILD_DIR / "html"
LOG_PATH = BUILD_DIR / "book-build.log"
BUILD_TIMEOUT_S = 60 * 60  # nine chapters at <2 min each, plus Sphinx; far above a normal build
# What a book build reads: a change to any of these makes an earlier build stale.
SOURCE_GLOBS = ("_config.yml", "_toc.yml", "book/**/*", "chapters/*.md", "exercises/*.ipynb",
                "memwall/**/*.py", "memwall/**/*.c", "memwall/**/*.js", "memwall/data/*",
                "requirements.txt")  # fmt: skip


@dataclass(frozen=True)
class BookBuild:
    returncode: int
    log: str
    html_dir: Path
    reused: bool


def toc_files(toc_path: Path = REPO / "_toc.yml") -> list[str]:
    """Every `file:` entry of a Jupyter Book toc, in order (root first), without extension."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return files


def source_path(entry: str, root: Path = REPO) -> Path | None:
    """The file behind a toc entry (which has no extension), or None if there is none.

    A chapter's MyST source wins over the .ipynb generated beside it, as in the book build."""
    for suffix in (".md", ".ipynb"):
        if (root / f"{entry}{suffix}").is_file():
            return root / f"{entry}{suffix}"
    return None


def missing_toc_files(root: Path = REPO) -> list[str]:
    return [entry for entry in toc_files(root / "_toc.yml") if source_path(entry, root) is None]


def newest_source_mtime() -> float:
    return max((p.stat().st_mtime for pattern in SOURCE_GLOBS for p in REPO.glob(pattern) if p.is_file()),
               default=0.0)  # fmt: skip


def _reusable_build() -> BookBuild | None:
    if not (LOG_PATH.is_file() and (HTML_DIR / "index.html").is_file()):
        return None
    if LOG_PATH.stat().st_mtime < newest_source_mtime():
        return None  # a source changed after that build
    log = LOG_PATH.read_text(errors="replace")
    if log.rstrip().splitlines()[-1:] != ["exit status 0"]:
        return None  # that build failed
    return BookBuild(0, log, HTML_DIR, reused=True)


def drop_stale_execution_cache(book_root: Path = REPO) -> bool:
    """Delete the chapters' execution cache if memwall's code changed since the last build.

    jupyter-cache reruns a notebook only when its own cells change; outputs made by older memwall
    code would otherwise be reused. (The Makefile's `book` target does the same.)
    """
    database = book_root / "_build" / ".jupyter_cache" / "global.db"
    if not database.is_file():
        return False
    built = database.stat().st_mtime
    if any(p.stat().st_mtime > built for p in (book_root / "memwall").rglob("*.py")):
        shutil.rmtree(database.parent)
        return True
    return False


def binder_session_env(start: Path = REPO / "binder" / "start") -> dict[str, str]:
    """The variables binder/start exports to a Binder session (`export NAME=VALUE` lines), so that
    a build here measures the memory a reader's session there would use."""
    if not start.is_file():
        return {}
    exports = re.findall(r"^export (\w+)=(\S+)$", start.read_text(), re.M)
    return dict(exports)


# Each chapter's kernel records its own peak: an IPython startup file (in an IPYTHONDIR that only
# the build's kernels see) writes, after every cell, the kernel's high-water mark and a hash of
# each cell it ran, so that the book test can name the chapter that went over Binder's budget.
KERNEL_PEAKS_ENV = "MEMWALL_KERNEL_PEAKS"  # as the startup file below reads it
_KERNEL_PEAK_STARTUP = """
def _memwall_record_peak(result, _cells=[]):
    import hashlib, json, os
    from pathlib import Path

    _cells.append(hashlib.sha1((result.info.raw_cell or "").strip().encode()).hexdigest())
    try:  # VmHWM is Linux's; elsewhere, or if the folder is gone, nothing is recorded
        status = Path("/proc/self/status").read_text().splitlines()
        peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
        record = Path(os.environ["MEMWALL_KERNEL_PEAKS"]) / f"{os.getpid()}.json"
        record.with_suffix(".part").write_text(
            json.dumps({"pid": os.getpid(), "peak_rss_bytes": peak, "cells": _cells}))
        os.replace(record.with_suffix(".part"), record)
    except (OSError, StopIteration, KeyError):
        pass


if __import__("os").environ.get("MEMWALL_KERNEL_PEAKS"):
    get_ipython().events.register("post_run_cell", _memwall_record_peak)
del _memwall_record_peak
"""


def kernel_peak_env(build_dir: Path) -> dict[str, str]:
    """The variables that make the build's kernels record their peaks under build_dir (emptied)."""
    peaks, ipython = build_dir / "kernel_peaks", build_dir / "ipython"
    shutil.rmtree(peaks, ignore_errors=True)
    peaks.mkdir(parents=True)
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-memwall-kernel-peak.py").write_text(_KERNEL_PEAK_STARTUP)
    return {"IPYTHONDIR": str(ipython), KERNEL_PEAKS_ENV: str(peaks)}


def _cell_hashes(notebook: Path) -> set[str]:
    import nbformat

    cells = nbformat.read(str(notebook), as_version=4).cells
    return {
        hashlib.sha1(c.source.strip().encode()).hexdigest() for c in cells if c.cell_type == "code"
    }


def chapter_peaks(build_dir: Path = BUILD_DIR, root: Path = REPO) -> dict[str, int]:
    """{chapter: peak resident bytes of the kernel that ran it} from the last build's records.

    A kernel is matched to the chapter (chapters/*.ipynb, generated from the sources the book
    runs) that shares the most cells with what it ran; a chapter run twice keeps its larger peak."""
    chapters = {p.stem: _cell_hashes(p) for p in sorted((root / "chapters").glob("*.ipynb"))}
    peaks: dict[str, int] = {}
    for path in sorted((build_dir / "kernel_peaks").glob("*.json")):
        record = json.loads(path.read_text())
        ran = set(record["cells"])
        name, shared = max(((n, len(ran & cells)) for n, cells in chapters.items()),
                           key=lambda pair: pair[1], default=(None, 0))  # fmt: skip
        if name is not None and shared * 2 > len(ran):  # most of its cells are that chapter's
            peaks[name] = max(peaks.get(name, 0), record["peak_rss_bytes"])
    return peaks


def run_build(book_root: Path = REPO, extra_args: tuple[str, ...] = ()) -> BookBuild:
    """Run jupyter-book on book_root; the log is also written to <book_root>/_build/book-build.log."""
    drop_stale_execution_cache(book_root)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
               "build", str(book_root), "-W", "--keep-going", "--all", *extra_args]  # fmt: skip
    started = time.monotonic()
    # Through a small parent whose only children are the build and, under it, the chapters'
    # kernels: its RUSAGE_CHILDREN high-water mark is then the largest of them (Binder's budget).
    command = [sys.executable, "-c", _PEAK_RSS_PARENT, *command]
    result = subprocess.run(command, cwd=book_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", timeout=BUILD_TIMEOUT_S,
                            env={**os.environ, **binder_session_env(),
                                 **kernel_peak_env(book_root / "_build")})  # fmt: skip
    log = f"{result.stdout}\nbuild took {time.monotonic() - started:.0f} s\nexit status {result.returncode}\n"
    (book_root / "_build").mkdir(exist_ok=True)
    (book_root / "_build" / "book-build.log").write_text(log)
    return BookBuild(result.returncode, log, book_root / "_build" / "html", reused=False)


_PEAK_RSS_PARENT = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
print("peak RSS of the build and its kernels (bytes):", peak, flush=True)
sys.exit(code)
"""
PEAK_RSS_LINE = re.compile(r"^peak RSS of the build and its kernels \(bytes\): (\d+)$", re.M)


def peak_rss_bytes(log: str) -> int | None:
    """The largest resident set of any process of the build (the chapters' kernels included)."""
    match = PEAK_RSS_LINE.search(log)
    return int(match[1]) if match else None


_SESSION_BUILD: BookBuild | None = None


def built_book() -> BookBuild:
    """The session's book build (built at most once per process)."""
    global _SESSION_BUILD
    if _SESSION_BUILD is None:
        reused = _reusable_build() if os.environ.get("MEMWALL_REUSE_BUILD") == "1" else None
        _SESSION_BUILD = reused or run_build()
    return _SESSION_BUILD


def warning_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]


def partial_build(execute: bool = True) -> BookBuild:
    """Build a copy of the book whose toc keeps only the files that exist (development aid)."""
    workdir = Path(tempfile.mkdtemp(prefix="memwall-book-"))
    ignore = shutil.ignore_patterns(".venv", "_build", ".git", "__pycache__", ".pytest_cache")
    shutil.copytree(REPO, workdir / "book-copy", ignore=ignore)
    root = workdir / "book-copy"
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    for part in toc.get("parts", []):
        part["chapters"] = [
            e for e in part["chapters"] if "file" not in e or source_path(e["file"], root)
        ]
        part["chapters"] = [e for e in part["chapters"]
                            if "glob" not in e or list(root.glob(e["glob"] + ".ipynb"))]  # fmt: skip
    toc["parts"] = [part for part in toc["parts"] if part["chapters"]]
    (root / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    config = yaml.safe_load((root / "_config.yml").read_text())
    if execute:  # keep executed chapters between partial builds: only changed ones rerun
        config["execute"]["cache"] = str(
            Path(tempfile.gettempdir()) / "memwall-partial-jupyter-cache"
        )
    else:
        config["execute"]["execute_notebooks"] = "off"
    (root / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_build(root)


if __name__ == "__main__":
    if "--partial" not in sys.argv:
        sys.exit(
            "usage: python tests/book_build.py --partial [--no-execute]   (full build: make book)"
        )
    build = partial_build(execute="--no-execute" not in sys.argv)
    print("\n".join(warning_lines(build.log)) or "no warnings")
    print(f"exit status {build.returncode}; site in {build.html_dir}")
