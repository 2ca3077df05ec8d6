"""Does `fraction_of_roofline` hold across processes? Run `memwall bench decode` in fresh processes.

The target (issue 15): on a shared machine whose bandwidth jumps between levels, the fractions from
three fresh processes agree within 1.2x, because each takes its roofline from bandwidth probes
interleaved with its own timed repeats. Usage:

    .venv/bin/python benchmarks/stability.py [--runs 3] [-- extra memwall bench decode options]

Prints each process's fraction, tok/s and probe spread, then max/min of the fractions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

TARGET = 1.2


def run_once(extra: list[str]) -> dict:
    command = [sys.executable, "-m", "memwall.cli", "bench", "decode", "--json", *extra]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("extra", nargs="*", help="options passed to memwall bench decode")
    args = parser.parse_args(argv)
    fractions = []
    for index in range(args.runs):
        result = run_once(args.extra)
        fractions.append(result["fraction_of_roofline"])
        print(
            f"process {index + 1}: fraction_of_roofline {result['fraction_of_roofline']:.3f}  "
            f"{result['tok_per_s']:.1f} tok/s  probes "
            f"{result['bandwidth_probe_min_bytes_per_s'] / 1e9:.1f}-"
            f"{result['bandwidth_probe_max_bytes_per_s'] / 1e9:.1f} GB/s "
            f"(spread {result['bandwidth_probe_spread']:.2f}x)  load {result['load_average_1min']}"
        )
    ratio = max(fractions) / min(fractions)
    verdict = "within" if ratio <= TARGET else "OUTSIDE"
    print(f"max/min of the fractions: {ratio:.2f}x ({verdict} the {TARGET}x target)")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
