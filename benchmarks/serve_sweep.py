"""Serving benchmark: `memwall serve` on its fast path and on the readable engine, at concurrency
1, 4 and 8, next to `memwall bench batch` at B=8 in the same sitting, and optionally
llama-cpp-python's server on the shipped Q4_1 file.

    .venv/bin/python benchmarks/serve_sweep.py                # memwall serve fast and readable
    .venv/bin/python benchmarks/serve_sweep.py --llamacpp     # + llama-cpp-python's server

Targets (issues 16 and 38; printed, never asserted): the fast server's total tok/s at concurrency 8
>= 4x its concurrency 1, and >= 80% of `memwall bench batch --fast` at B=8 (the difference is the
server's own overhead: HTTP, text, one prefill per arrival). The table gives each server's median
TTFT and TPOT too, and `bench serve`'s honest counts (ok, cut short). Each server runs alone in its
own process while it is measured; the load generator runs in a process of its own as well
(memwall.bench.load).

`--llamacpp` installs llama-cpp-python[server] into benchmarks/.venv-llamacpp on first use (pip,
network needed once; never part of `make test`) and serves the shipped SmolLM2 Q4_1 GGUF with
2 threads. That server runs one request at a time; it is started with `--interrupt_requests False`,
since by default a new request cuts the running one short (`bench serve` would count those as cut
short, not as ok).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMACPP_VENV = ROOT / "benchmarks" / ".venv-llamacpp"


def wait_for(url: str, process: subprocess.Popen, log, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            log.seek(0)
            last = log.read().decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(
                f"the server exited with code {process.returncode}: " + " / ".join(last)
            )
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {timeout_s} s")


def measure_server(command, url, args) -> list[dict]:
    from memwall.bench.serve import sweep

    # The server's log goes to a file: llama.cpp logs every request, and an unread pipe fills up
    # and stops the server mid-sweep.
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(url, server, log)
        levels = [int(c) for c in args.concurrency.split(",")]
        return sweep(
            url, levels, requests=None, max_tokens=args.max_tokens, ignore_eos=True, timeout_s=600
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def llamacpp_command(port: int) -> list[str]:
    """llama-cpp-python's OpenAI server on the shipped GGUF, from benchmarks/.venv-llamacpp (the
    venv benchmarks/llamacpp_compare.py uses too); its [server] extra is installed on first use."""
    python = LLAMACPP_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LLAMACPP_VENV)], check=True)
    probe = subprocess.run(
        [str(python), "-c", "import uvicorn, llama_cpp.server.app"], capture_output=True
    )
    if probe.returncode != 0:
        print(f"installing llama-cpp-python[server] into {LLAMACPP_VENV} (once)", flush=True)
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON")}
        pip = [str(python), "-m", "pip", "install", "--no-cache-dir", "llama-cpp-python[server]"]
        subprocess.run(pip, check=True, env=env)
    from memwall import models

    command = [str(python), "-m", "llama_cpp.server", "--model", str(models.gguf_path())]
    # Without --interrupt_requests False a new request cuts the running one short (its default).
    return command + [
        "--n_threads", "2", "--interrupt_requests", "False",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def ms(value) -> str:
    """A median in ms, 8 wide; '-' when no request succeeded."""
    return f"{value:>8.1f}" if value is not None else f"{'-':>8}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--port", type=int, default=8311)
    parser.add_argument("--prefill-chunk", type=int, default=0)
    parser.add_argument("--llamacpp", action="store_true", help="also sweep llama-cpp-python")
    parser.add_argument(
        "--record", action="store_true", help="save the results under benchmarks/results/"
    )
    args = parser.parse_args()
    results = {}
    for fast in ("on", "off"):
        memwall = [str(Path(sys.executable).parent / "memwall"), "serve", "--model", args.model]
        memwall += ["--port", str(args.port), "--max-batch", "16", "--fast", fast]
        memwall += ["--prefill-chunk", str(args.prefill_chunk)]
        name = "memwall fast" if fast == "on" else "memwall readable"
        results[name] = measure_server(memwall, f"http://127.0.0.1:{args.port}/v1", args)
    if args.llamacpp:
        port = args.port + 1
        results["llama-cpp-python"] = measure_server(
            llamacpp_command(port), f"http://127.0.0.1:{port}/v1", args
        )

    from memwall.bench import save_record
    from memwall.bench.batch import bench_batch

    batch = {
        fast: bench_batch(
            args.model, [1, 8], context=16, new_tokens=args.max_tokens, repeats=3, fast=fast
        )
        for fast in (True, False)
    }
    batch_tok_s = {
        fast: {row["batch"]: row["tok_per_s"] for row in result["rows"]}
        for fast, result in batch.items()
    }
    print(
        f"\nmemwall bench batch, same sitting: B=8 {batch_tok_s[True][8]:.1f} tok/s fast, "
        f"{batch_tok_s[False][8]:.1f} readable (load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"{'server':>18} {'clients':>7} {'ok':>4} {'short':>5} {'total tok/s':>12} "
        f"{'TTFT ms':>8} {'TPOT ms':>8} {'x c=1':>6} {'of batch B=8':>13}"
    )
    for name, runs in results.items():
        base = runs[0]["throughput_tok_per_s"] or float("nan")
        reference = batch_tok_s[name != "memwall readable"][8]  # llama.cpp: against the fast one
        for r in runs:
            total = r["throughput_tok_per_s"]
            print(
                f"{name:>18} {r['concurrency']:>7} {r['succeeded']:>4} {r['cut_short']:>5} "
                f"{total:>12.1f} {ms(r['ttft']['median_ms'])} {ms(r['tpot']['median_ms'])} "
                f"{total / base:>6.2f} {total / reference:>13.0%}"
            )
    fast_runs = {r["concurrency"]: r["throughput_tok_per_s"] for r in results["memwall fast"]}
    if 1 in fast_runs and 8 in fast_runs:
        print(
            f"targets: fast c=8 / c=1 = {fast_runs[8] / fast_runs[1]:.2f} (>= 4), "
            f"fast c=8 / bench batch --fast B=8 = {fast_runs[8] / batch_tok_s[True][8]:.0%} (>= 80%)"
        )
    if args.record:
        record = {
            "servers": results,
            "bench_batch": {"fast": batch[True], "readable": batch[False]},
            "max_tokens": args.max_tokens,
        }
        print(f"record: {save_record(record, 'serve_sweep')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
