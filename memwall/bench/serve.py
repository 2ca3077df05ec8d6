"""`memwall bench serve`: TTFT, TPOT and throughput of any OpenAI-compatible endpoint under load.

Point it at memwall's own server, vLLM, SGLang or llama.cpp's server. `--concurrency 1,2,4,8,16`
sweeps the number of clients and prints the latency-throughput frontier: what each user gets
(tok/s of one stream, 1 / TPOT) against what the server delivers in all (total output tok/s).
Every request's output tokens and finish reason are checked: one that stopped early is reported
as cut short, never as ok. `--ignore-eos` asks for fixed output lengths (vLLM's extension).
The measuring code is memwall.bench.load; memwall.bench.interference measures prefill/decode
interference on memwall's own server.
"""

from __future__ import annotations

import json
import os

from memwall.bench.load import DEFAULT_PROMPT, ENDPOINTS, run_load


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency takes positive integers like 1,2,4,8, got {text!r}")
    return levels


def sweep(url, concurrencies, requests=None, per_client: int = 4, **options) -> list[dict]:
    """run_load at each concurrency, one after another; `requests` defaults to `per_client`
    requests a client (and no fewer than two clients' worth), so every level runs a few rounds."""
    return [
        run_load(url, concurrency=c, requests=requests or per_client * max(2, c), **options)
        for c in concurrencies
    ]


def frontier_rows(runs: list[dict]) -> list[dict]:
    """The latency-throughput frontier: per-user tok/s against total tok/s at each concurrency."""
    return [
        {
            "concurrency": r["concurrency"],
            "per_user_tok_per_s": r["per_user_tok_per_s"],
            "total_tok_per_s": r["throughput_tok_per_s"],
            "ttft_median_ms": r["ttft"]["median_ms"],
        }
        for r in runs
    ]


def add_cli(bench_subparsers):
    parser = bench_subparsers.add_parser(
        "serve", help="TTFT/TPOT and the latency-throughput frontier of an OpenAI-compatible server"
    )
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000[/v1]")
    parser.add_argument(
        "--concurrency", default="1", help="clients, or a sweep such as 1,2,4,8,16 (default 1)"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per level (default 4 per client, >= 8)"
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds per level at most")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to ask for per request")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly --max-tokens tokens each"
    )
    parser.add_argument(
        "--request-rate", type=float, default=None, help="Poisson arrivals per second (open loop)"
    )
    parser.add_argument(
        "--endpoint", choices=ENDPOINTS, default="completions", help="OpenAI API to call"
    )
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the prompt every request sends")
    parser.add_argument(
        "--served-model", default=None, help="the 'model' to send (default: the first listed)"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request at most")
    parser.add_argument(
        "--api-key", help="sent as 'Authorization: Bearer KEY' (default: $MEMWALL_API_KEY)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_cli)


def run_cli(args) -> int:
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests must be at least 1, got {args.requests}")
    for name in ("duration", "timeout"):  # NaN fails this too
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name} must be a positive number of seconds")
    runs = sweep(
        args.url,
        parse_levels(args.concurrency),
        requests=args.requests,
        duration_s=args.duration,
        max_tokens=args.max_tokens,
        prompt=args.prompt,
        model=args.served_model,
        timeout_s=args.timeout,
        ignore_eos=args.ignore_eos,
        request_rate=args.request_rate,
        endpoint=args.endpoint,
        api_key=args.api_key or os.environ.get("MEMWALL_API_KEY"),
    )
    all_ok = all(r["succeeded"] == r["requests"] > 0 for r in runs)
    if args.json:
        # The client's machine: the server's too when it runs locally.
        from memwall.machine.fingerprint import machine_fingerprint

        record = {"runs": runs, "frontier": frontier_rows(runs), "machine": machine_fingerprint()}
        print(json.dumps(record, indent=2))
        return 0 if all_ok else 1
    first = runs[0]
    arrivals = f"Poisson {first['request_rate']}/s" if first["request_rate"] else "closed loop"
    print(
        f"{first['url']} (model {first['model']}), {first['endpoint']}, max_tokens "
        f"{first['max_tokens']}{', ignore_eos' if first['ignore_eos'] else ''}, {arrivals}"
    )
    print(
        f"{'clients':>7} {'reqs':>5} {'ok':>4} {'short':>5} {'err':>4} {'TTFT p50':>9} "
        f"{'TPOT p50':>9} {'per-user tok/s':>15} {'total tok/s':>12}  finish reasons"
    )
    for r in runs:
        print(
            f"{r['concurrency']:>7} {r['requests']:>5} {r['succeeded']:>4} {r['cut_short']:>5} "
            f"{r['failed']:>4} {_ms(r['ttft']['median_ms']):>9} {_ms(r['tpot']['median_ms']):>9} "
            f"{_num(r['per_user_tok_per_s']):>15} {_num(r['throughput_tok_per_s']):>12}  "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["finish_reasons"].items()))
        )
    for r in runs:
        _explain_problems(r)
    return 0 if all_ok else 1


def _explain_problems(run: dict) -> None:
    short = [p for p in run["per_request"] if p["outcome"] == "cut short"]
    if short:
        shown = ", ".join(
            f"{p['tokens']}/{run['max_tokens']} tokens ({p['finish_reason'] or 'no finish_reason'})"
            for p in short[:4]
        )
        print(f"  concurrency {run['concurrency']}: {len(short)} request(s) cut short: {shown}")
    for error in run["errors"]:
        print(f"  concurrency {run['concurrency']}: error: {error}")


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"
