"""How much memory this process uses and may use: RSS now and at its peak, memory still free.

Binder gives a session 1-2 GB, enforced by a cgroup, while /proc/meminfo shows the whole host;
`available_memory_bytes()` takes the smaller of the two. `notebook_peak_rss()` executes a
notebook in a fresh kernel and reports the kernel's peak RSS, for the book's memory test:

    python -m memwall.memory chapters/03_memory_wall.md     # prints JSON

Standard library only (nbclient, and jupytext for MyST sources, in the child that runs a notebook).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


def _ru_maxrss_bytes(who: int) -> int:
    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def peak_rss_bytes() -> int:
    """The most resident memory this process has held so far."""
    return _ru_maxrss_bytes(resource.RUSAGE_SELF)


def current_rss_bytes() -> int:
    """Resident memory of this process now (0 where /proc is missing and psutil too)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return 0


def _cgroup_headroom() -> int | None:
    for limit_file, usage_file in _CGROUP_FILES:
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 2**60:  # no limit set
            return None
        return max(0, int(limit) - usage)
    return None


def available_memory_bytes() -> int:
    """Memory a new allocation can take without swapping or hitting a container limit; 0 if
    unknown. The smaller of the kernel's MemAvailable and the cgroup limit minus its usage."""
    free = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    if not free:
        try:
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            free = 0
    headroom = _cgroup_headroom()
    if headroom is not None:
        free = min(free, headroom) if free else headroom
    return free


# ---- a notebook's peak -------------------------------------------------------------------------


def _read_notebook(path: Path):
    if path.suffix == ".md":
        import jupytext

        return jupytext.read(path, fmt="md:myst")  # the chapters' format
    import nbformat

    return nbformat.read(path, as_version=4)


def _execute_here(path: Path, timeout: int, kernel: str) -> dict:
    """Run the notebook from this process; the kernel is our child, so once it has exited and
    been reaped, RUSAGE_CHILDREN's maximum is its peak (or a larger descendant's)."""
    from nbclient import NotebookClient

    notebook = _read_notebook(path)
    start, error = time.perf_counter(), None
    try:
        NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name=kernel,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    except Exception as failure:  # a failing cell still has a peak worth reporting
        error = f"{type(failure).__name__}: {str(failure).strip().splitlines()[-1:]}"
    return {
        "notebook": str(path),
        "peak_rss_bytes": _ru_maxrss_bytes(resource.RUSAGE_CHILDREN),
        "seconds": time.perf_counter() - start,
        "ok": error is None,
        "error": error,
    }


def notebook_peak_rss(
    path, timeout: int = 600, kernel: str = "python3", env: dict | None = None
) -> dict:
    """Execute `path` (.ipynb, or a MyST .md notebook) in a fresh kernel and return
    {"notebook", "peak_rss_bytes", "seconds", "ok", "error"}.

    It runs in a new Python process, so no earlier kernel's peak is counted. `timeout` is per
    cell; the whole run gets 20 cells' worth.
    """
    command = [sys.executable, "-m", "memwall.memory", str(path), "--timeout", str(timeout)]
    command += ["--kernel", kernel]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout * 20,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(f"could not run {path}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Execute a notebook; print its peak RSS as JSON.")
    parser.add_argument("notebook", type=Path, help=".ipynb or MyST .md notebook")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("--kernel", default="python3", help="Jupyter kernel name")
    args = parser.parse_args(argv)
    print(json.dumps(_execute_here(args.notebook.resolve(), args.timeout, args.kernel)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
