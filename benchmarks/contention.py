"""Decode speed on a quiet machine and beside one busy process: does each engine share the cores?

    .venv/bin/python benchmarks/contention.py [--new-tokens 64] [--rounds 2] [--out DIR]

Binder, Colab and a reader's other notebook all put other work on the cores an engine uses. This
times batch-1 decode (`memwall bench decode`: memwall's fast path and the readable engine the
chapters run, each in fp32, int8 and int4) and, when `benchmarks/llamacpp_compare.py --install` has built it,
llama.cpp on the shipped Q4_1 file, first quiet, then with one `while True: pass` process beside
it, alternating the conditions over `--rounds` rounds. Each condition runs in fresh processes,
so no thread pool or measured thread count carries over.

A third condition, quiet on one thread, is the ceiling: with another process on one of the cores,
an engine has about one core to itself, and no engine can beat what one thread does alone. A path
whose busy speed reaches it shares the machine as well as it can; what it keeps of the quiet speed
then depends on how much faster two cores are than one on this machine (for a path that one core
already runs at memory speed, far more than half).

It prints tok/s quiet, busy and on one thread, the kept fraction (busy over quiet) and the busy
speed over the one-thread ceiling per path, and saves a record
(`contention-<machine id>-<date>.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from memwall.bench.records import save_record  # noqa: E402
from memwall.machine import usable_cores  # noqa: E402

MEMWALL = [sys.executable, "-m", "memwall.cli"]


@contextmanager
def busy_loop(on: bool):
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if process is not None:
            process.kill()
            process.wait()


def memwall_paths(new_tokens: int, env=None) -> dict[str, float]:
    """tok/s of each memwall path, from one `bench decode` process per engine setting."""
    speeds = {}
    for fast in ("on", "off"):
        command = [*MEMWALL, "bench", "decode", "--json", "--new-tokens", str(new_tokens)]
        command += ["--fast", fast, "--quant", "none,int8,int4", "--repeats", "3"]
        result = json.loads(
            subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
        )
        # one engine prints a flat record; several print one record per engine label
        engines = {result["engine"]: result} if "tok_per_s" in result else result
        for label, value in engines.items():
            if isinstance(value, dict) and "tok_per_s" in value:
                speeds[label if fast == "on" else f"{label}-readable"] = value["tok_per_s"]
    return speeds


def llama_cpp(new_tokens: int, threads: int) -> dict[str, float]:
    script = HERE / "llamacpp_compare.py"
    if not (HERE / ".venv-llamacpp" / "bin" / "python").exists():
        return {}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "compare.json"
        command = [sys.executable, str(script), "--rounds", "3", "--new-tokens", str(new_tokens)]
        command += ["--threads", str(threads)]
        done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            print(f"llama.cpp not timed: {done.stderr.strip().splitlines()[-1:]}")
            return {}
        medians = json.loads(out.read_text())["tok_per_s_median"]
    return {"llama.cpp Q4_1": medians["llama.cpp"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results folder")
    args = parser.parse_args(argv)
    cores = usable_cores()  # as memwall's engines count them: affinity and CPU quota
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}
    samples: dict[str, dict[str, list[float]]] = {"quiet": {}, "busy": {}, "one thread": {}}
    for round_number in range(args.rounds):
        for condition in samples:
            alone = condition == "one thread"
            with busy_loop(condition == "busy"):
                speeds = memwall_paths(args.new_tokens, one_thread if alone else None)
                speeds |= llama_cpp(args.new_tokens, 1 if alone else cores)
            for path, tok_s in speeds.items():
                samples[condition].setdefault(path, []).append(tok_s)
            print(
                f"round {round_number + 1}, {condition}: "
                + ", ".join(f"{p} {v:.1f}" for p, v in speeds.items()),
                flush=True,
            )
    table = {}
    print(
        f"\n{'path':<20} {'quiet':>7} {'busy':>7} {'1 thread':>9} {'kept':>6} {'of 1 thread':>12}"
    )
    for path in samples["quiet"]:
        if not all(path in samples[key] for key in ("busy", "one thread")):
            continue
        row = {key: statistics.median(samples[key][path]) for key in ("quiet", "busy")}
        row["one_thread"] = statistics.median(samples["one thread"][path])
        row["kept"] = row["busy"] / row["quiet"]
        row["of_one_thread"] = row["busy"] / row["one_thread"]
        table[path] = row
        print(
            f"{path:<20} {row['quiet']:>7.1f} {row['busy']:>7.1f} {row['one_thread']:>9.1f}"
            f" {row['kept']:>6.0%} {row['of_one_thread']:>12.0%}"
        )
    record = {
        "benchmark": "contention",
        "new_tokens": args.new_tokens,
        "cores": cores,
        "paths": table,
        "samples": samples,
    }
    print(f"saved {save_record(record, 'contention', args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
