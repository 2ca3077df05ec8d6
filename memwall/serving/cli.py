"""`memwall serve` (start the OpenAI-compatible server) and `memwall bench serve` (load-test any endpoint)."""

from __future__ import annotations

import json
import socket
import threading


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "serve", help="serve memwall's engine over an OpenAI-compatible HTTP API"
    )
    parser.add_argument("--model", default="smollm2-135m", help="model name or hub id")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.set_defaults(run=run_serve)


def add_bench_serve(bench_subparsers):
    parser = bench_subparsers.add_parser(
        "serve", help="TTFT/TPOT of an OpenAI-compatible endpoint under load"
    )
    parser.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    parser.add_argument("--requests", type=int, default=8, help="stop after this many requests")
    parser.add_argument("--duration", type=float, default=60.0, help="stop after this many seconds")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to ask for per request")
    parser.add_argument(
        "--prompt",
        default="Explain why decoding a language model is limited by memory bandwidth.",
        help="the prompt every request sends",
    )
    parser.add_argument(
        "--served-model", default=None, help="the 'model' field to send, if the server needs one"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_bench_serve)


def run_serve(args):
    from memwall import models
    from memwall.engine import Transformer
    from memwall.serving.server import start_server

    ensure_port_free(args.host, args.port)  # before the slow model load
    hf_model, tokenizer = models.load(args.model)
    try:
        server = start_server(
            Transformer.from_hf(hf_model), tokenizer, args.model, args.host, args.port
        )
    except OSError as error:  # taken meanwhile, or an address this machine does not have
        raise ValueError(f"cannot serve on {args.host}:{args.port}: {error.strerror}") from None
    print(
        f"memwall serving {args.model} at http://{args.host}:{server.server_port}/v1 (Ctrl-C to stop)"
    )
    try:
        threading.Event().wait()  # the server runs in its own thread
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def ensure_port_free(host: str, port: int) -> None:
    """A ValueError naming the port when something already listens there (or it is not ours)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself does
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"cannot serve on {host}:{port}: {error.strerror}; choose another --port."
            ) from None


def run_bench_serve(args):
    from memwall.serving.load import run_load

    summary = run_load(
        args.url,
        args.concurrency,
        args.requests,
        args.duration,
        args.max_tokens,
        args.prompt,
        args.served_model,
    )
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0 if summary["succeeded"] else 1
    print(
        f"{args.url}  concurrency {args.concurrency}: {summary['succeeded']}/{summary['requests']} requests ok "
        f"in {summary['wall_s']:.1f} s"
    )
    for name in ("ttft", "tpot", "latency"):
        s = summary[name]
        if s["median_ms"] is not None:
            print(
                f"  {name.upper():8s} median {s['median_ms']:9.1f} ms   p90 {s['p90_ms']:9.1f} ms"
            )
    print(f"  throughput {summary['throughput_tok_per_s']:.1f} output tok/s")
    for error in summary["errors"]:
        print(f"  error: {error}")
    return 0 if summary["succeeded"] else 1
