"""memwall's 4-bit decode against llama.cpp on the same GGUF file, same machine, same threads.

    python benchmarks/llamacpp_compare.py --install     # once: builds llama-cpp-python (~10 min)
    .venv/bin/python benchmarks/llamacpp_compare.py     # alternate both engines, print the ratio

The file is the one memwall ships its offline model in: SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1
layers: 4-bit codes with a scale and a minimum per 32 weights; a Q8_0 head). memwall loads it,
dequantized, and quantizes it again to its closest format: int4 with groups of 32 (scale and
offset per group, the same bytes per weight as Q4_1) and an int8 head. llama.cpp reads the file
as it is. Both decode greedily after the same prompt, with the same thread count, in alternating
rounds (memwall in this process, llama.cpp in a worker process running from its own venv,
benchmarks/.venv-llamacpp, so that llama-cpp-python's dependencies never enter memwall's). The
record, with the machine fingerprint, goes to
benchmarks/results/llamacpp_compare-<machine id>-<date>.json (`--out` to write elsewhere).

Never part of `make test`: it needs the network once (--install) and minutes of quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LLAMA_VENV = HERE / ".venv-llamacpp"
LLAMA_PYTHON = LLAMA_VENV / "bin" / "python"
PROMPT = "The memory wall is the gap between how fast a processor computes and"


def install() -> None:
    """A venv of its own with llama-cpp-python built for this CPU (from source: ~10 minutes)."""
    subprocess.run([sys.executable, "-m", "venv", str(LLAMA_VENV)], check=True)
    env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DGGML_NATIVE=ON")}
    pip = [str(LLAMA_PYTHON), "-m", "pip", "install", "--no-cache-dir"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "llama-cpp-python", "numpy"], check=True, env=env)
    print(f"installed llama-cpp-python in {LLAMA_VENV}")


# ---- the llama.cpp side: a worker that answers one JSON line per request -------------------------


def worker(model_path: str, threads: int) -> None:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path=model_path, n_threads=threads, n_threads_batch=threads, n_ctx=1024, verbose=False
    )
    print(json.dumps({"ready": True, "version": __import__("llama_cpp").__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        prompt = llm.tokenize(request["prompt"].encode(), add_bos=True)
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        first = time.perf_counter()
        tokens = [token]
        for _ in range(request["new_tokens"] - 1):
            llm.eval([token])
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            tokens.append(token)
        end = time.perf_counter()
        steps = request["new_tokens"] - 1
        print(
            json.dumps(
                {"ttft_s": first - start, "tok_per_s": steps / (end - first), "tokens": tokens}
            ),
            flush=True,
        )


class LlamaWorker:
    def __init__(self, model_path: Path, threads: int):
        if not LLAMA_PYTHON.exists():
            raise SystemExit(f"no {LLAMA_VENV}: run `python {Path(__file__).name} --install` first")
        self.process = subprocess.Popen(
            [str(LLAMA_PYTHON), __file__, "--worker", str(model_path), "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        self.info = json.loads(self.process.stdout.readline())

    def run(self, prompt: str, new_tokens: int) -> dict:
        self.process.stdin.write(json.dumps({"prompt": prompt, "new_tokens": new_tokens}) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


# ---- the memwall side ---------------------------------------------------------------------------


def memwall_runner(threads: int, fast: bool):
    import torch

    from memwall import models
    from memwall.engine import Transformer, generate
    from memwall.engine.accelerate import accelerate
    from memwall.engine.quant import quantize

    torch.set_num_threads(threads)
    hf_model, tokenizer = models.load("smollm2-135m")
    engine = quantize(Transformer.from_hf(hf_model), "int4", group_size=32, head="int8")
    del hf_model
    model = accelerate(engine) if fast else engine

    def run(prompt: str, new_tokens: int) -> dict:
        out = generate(model, tokenizer(prompt).input_ids, new_tokens)
        decode_s = sum(out.step_times_s)
        return {"ttft_s": out.ttft_s, "tok_per_s": len(out.step_times_s) / decode_s}

    return run


def compare(threads: int, rounds: int, new_tokens: int, fast: bool) -> dict:
    from memwall import models
    from memwall.machine.fingerprint import machine_fingerprint

    gguf = models.gguf_path()
    llama = LlamaWorker(gguf, threads)  # first: fails fast without the venv
    engines = {"memwall": memwall_runner(threads, fast)}
    engines["llama.cpp"] = lambda prompt, n: llama.run(prompt, n)
    try:
        for run in engines.values():
            run(PROMPT, 8)  # warm-up
        results = {name: [] for name in engines}
        for index in range(rounds):
            for name, run in engines.items():
                results[name].append(run(PROMPT, new_tokens)["tok_per_s"])
            print(
                f"round {index + 1}/{rounds}: "
                + ", ".join(f"{name} {values[-1]:.1f} tok/s" for name, values in results.items())
            )
    finally:
        llama.close()
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {
        "benchmark": "llamacpp_compare",
        "model_file": gguf.name,
        "memwall_format": "int4-g32, int8 head" + (", fast decode path" if fast else ""),
        "threads": threads,
        "new_tokens": new_tokens,
        "rounds": rounds,
        "tok_per_s_runs": results,
        "tok_per_s_median": medians,
        "memwall_over_llamacpp": medians["memwall"] / medians["llama.cpp"],
        "llama_cpp_python": llama.info.get("version"),
        "machine": machine_fingerprint(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="build llama-cpp-python (~10 min)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--readable", action="store_true", help="memwall's readable decode path")
    parser.add_argument("--worker", metavar="GGUF", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="default: a record in benchmarks/results")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.threads)
        return 0
    if args.install:
        install()
        return 0
    record = compare(args.threads, args.rounds, args.new_tokens, fast=not args.readable)
    medians = record["tok_per_s_median"]
    print(
        f"memwall {medians['memwall']:.1f} tok/s, llama.cpp {medians['llama.cpp']:.1f} tok/s: "
        f"memwall / llama.cpp = {record['memwall_over_llamacpp']:.2f} ({args.threads} threads)"
    )
    if args.out is None:
        from memwall.bench.records import save_record

        args.out = save_record(record, "llamacpp_compare")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"recorded in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
