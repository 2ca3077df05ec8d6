"""Prefill/decode interference on memwall's own server: the TPOT of ongoing streams while a long
prompt arrives, with the prompt prefilled whole and in chunks (`memwall serve --prefill-chunk N`).

    .venv/bin/python benchmarks/prefill_interference.py                  # 2000-token prompt
    .venv/bin/python benchmarks/prefill_interference.py --prompt-tokens 1000 --chunks 0,128,512

The function behind it is memwall.bench.interference.measure_interference(engine, tokenizer).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--chunks", default="0,256", help="prefill chunk sizes; 0 means whole")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="write the result to this JSON file")
    args = parser.parse_args()

    from memwall import models
    from memwall.bench.interference import measure_interference
    from memwall.engine import Transformer

    hf_model, tokenizer = models.load(args.model)
    engine = Transformer.from_hf(hf_model)
    chunks = [int(c) or None for c in args.chunks.split(",")]
    result = measure_interference(
        engine, tokenizer, args.prompt_tokens, args.streams, chunks, repeats=args.repeats
    )
    print(
        f"{args.streams} streams decoding while a {args.prompt_tokens}-token prompt arrives "
        f"(medians of {args.repeats}; load average {os.getloadavg()[0]:.1f})"
    )
    print(
        f"{'prefill':>8} {'TPOT before':>12} {'TPOT during':>12} {'largest gap':>12} "
        f"{'tokens during':>14} {'long TTFT':>10} {'engine steps during':>20}"
    )
    for run in result["runs"]:
        chunk = run["prefill_chunk"] or "whole"
        print(
            f"{chunk:>8} {run['tpot_before_ms']:>9.1f} ms {run['tpot_during_ms']:>9.1f} ms "
            f"{run['max_gap_during_ms']:>9.1f} ms {run['stream_tokens_during_prefill']:>14.1f} "
            f"{run['long_ttft_ms']:>7.0f} ms {run['engine_steps_during_prefill']:>20.0f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
