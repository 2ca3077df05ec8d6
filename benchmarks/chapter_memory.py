"""Peak resident memory of each chapter's kernel, for Binder's 1-2 GB limit (target: at most 1.5 GB).

    .venv/bin/python benchmarks/chapter_memory.py               # every chapter
    .venv/bin/python benchmarks/chapter_memory.py 03 07         # chapters whose name starts so

Each chapter runs top to bottom in a fresh kernel (nbclient); after its last cell the kernel's
high-water mark (VmHWM in /proc/PID/status, Linux only) is read before the kernel shuts down.
The kernels get the environment binder/start gives a Binder session.
The book test judges the same figure, recorded by each chapter's kernel during the build
(tests/book_build.py); this script also says which cell raised it (--cells).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 1.5e9
sys.path.insert(0, str(REPO / "tests"))
from book_build import binder_session_env  # noqa: E402  (the book test's harness)


def kernel_peak_bytes(client, field: str = "VmHWM") -> int:
    """The kernel's high-water mark (VmHWM) or current resident set (VmRSS), from /proc."""
    pid = client.km.provisioner.process.pid
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} line: this script needs Linux's /proc")


def machine_line() -> str:
    """The limits the chapters' buffers are sized from here (a huge cache changes what they hold)."""
    from memwall.machine import buffer_budget_bytes, last_level_cache_bytes, memory_limit

    limit = memory_limit()
    where = f"{limit.limit_bytes / 1e9:.2f} GB ({limit.source})" if limit.limit_bytes else "none"
    return (
        f"memory limit {where}, {limit.available_bytes / 1e9:.1f} GB available; "
        f"last-level cache {last_level_cache_bytes() / 2**20:.0f} MiB; "
        f"a measurement's buffers take at most {buffer_budget_bytes() / 2**20:.0f} MiB"
    )


def run_chapter(path: Path, timeout: int, by_cell: bool = False) -> dict:
    nb = nbformat.read(str(path), as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    with client.setup_kernel():
        peak = 0
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if by_cell and cell.cell_type == "code":
                new_peak = kernel_peak_bytes(client)
                if new_peak > peak + 50e6:  # the cells that raised the high-water mark
                    first_line = cell.source.strip().splitlines()[0][:60] if cell.source else ""
                    print(
                        f"  cell {index:>3}: peak {new_peak / 1e9:.2f} GB, now "
                        f"{kernel_peak_bytes(client, 'VmRSS') / 1e9:.2f} GB  {first_line}"
                    )
                peak = new_peak
        peak = kernel_peak_bytes(client)
    return {"chapter": path.stem, "peak_rss_bytes": peak, "seconds": time.monotonic() - started}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefixes", nargs="*", help="chapter name prefixes (default: all)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--cells", action="store_true", help="name each cell that raised the peak by 50 MB or more"
    )
    args = parser.parse_args(argv)
    os.environ.update(binder_session_env())  # the kernels inherit binder/start's settings
    chapters = sorted((REPO / "chapters").glob("*.ipynb"))
    if args.prefixes:
        chapters = [p for p in chapters if any(p.name.startswith(x) for x in args.prefixes)]
    print(machine_line(), flush=True)
    results = []
    for path in chapters:
        result = run_chapter(path, args.timeout, by_cell=args.cells)
        results.append(result)
        verdict = "ok" if result["peak_rss_bytes"] <= LIMIT_BYTES else "OVER the 1.5 GB target"
        print(
            f"{result['chapter']:<18} peak RSS {result['peak_rss_bytes'] / 1e9:5.2f} GB "
            f"in {result['seconds']:4.0f} s  {verdict}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r["peak_rss_bytes"] <= LIMIT_BYTES for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
