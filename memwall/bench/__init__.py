"""memwall's benchmarks: `memwall bench <benchmark>` on the command line, functions for chapters.

- `harness`: warm-up, interleaved repeats, medians, a progress bar on terminals, device/dtype
  options, roofline fields and output formatting, shared by every benchmark.
- `workload`: models by name (or "random:<spec>" for random weights) and prompts.
- `decode`, `batch`, `speculative`, `serve`: one benchmark each, a function that returns a dict
  (`bench_decode(...)`) and its `memwall bench <name>` command; `load` and `interference` are
  the request streams and the busy neighbours that `serve` and the chapters use.
- `records`: `recorded(name)` loads benchmarks/results/<name>.json with a note saying whether it
  was recorded on a machine like this one; `save_record(result, name)` writes one, fingerprinted.

The roofline is measured with the work by `memwall.machine.probe.RooflineProbe`: a read of a
buffer past the last-level cache right before each timed repeat, each fraction taken from an
adjacent (probe, work) pair.

Adding a benchmark (say `memwall bench prefill`)
------------------------------------------------
Write `memwall/bench/prefill.py` with a Python function that returns a dict, and

    def add_cli(bench_subparsers):
        parser = bench_subparsers.add_parser("prefill", help="...")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(run=run_cli)      # run_cli(args) -> exit code

Use `harness.run_interleaved` for the timing and `harness.print_result` for the output, and list
the module in SUBCOMMANDS.
"""

from __future__ import annotations

import importlib
import sys

from memwall.bench.decode import bench_decode
from memwall.bench.records import recorded, save_record
from memwall.cli import COMMANDS

__all__ = ["SUBCOMMANDS", "bench_decode", "recorded", "register_cli", "save_record"]

# benchmark -> module whose add_cli(bench_subparsers) adds it.
SUBCOMMANDS = {
    "decode": "memwall.bench.decode",
    "batch": "memwall.bench.batch",
    "speculative": "memwall.bench.speculative",
    "serve": "memwall.bench.serve",
}


def register_cli(subparsers) -> None:
    """Add `memwall bench` and, under it, every benchmark in SUBCOMMANDS."""
    parser = subparsers.add_parser(
        "bench",
        help=COMMANDS["bench"].help,
        description="Benchmarks. `memwall bench <benchmark> --help` for options.",
    )
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for module_name in SUBCOMMANDS.values():
        importlib.import_module(module_name).add_cli(benchmarks)

    def run_without_benchmark(args) -> int:
        parser.print_help(sys.stderr)
        return 2

    parser.set_defaults(run=run_without_benchmark)
