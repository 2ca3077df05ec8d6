"""A notebook's peak memory: execute it in a fresh kernel and report the kernel's peak RSS.

The book's memory budget (a Binder session has 1-2 GB) is checked chapter by chapter with it:

    python -m memwall.machine.notebook_peak chapters/03_memory_wall.md     # prints JSON

nbclient, and jupytext for MyST sources, are needed only in the child that runs the notebook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from memwall.machine.memory import peak_rss_bytes


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
        "peak_rss_bytes": peak_rss_bytes(children=True),
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
    command = [
        sys.executable,
        "-m",
        "memwall.machine.notebook_peak",
        str(path),
        "--timeout",
        str(timeout),
    ]
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
