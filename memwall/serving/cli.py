"""`memwall serve`: start the OpenAI-compatible, continuously batching server on a model.

(`memwall bench serve`, which measures any such server, lives in memwall.bench.serve.)
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys

API_KEY_VARIABLE = "MEMWALL_API_KEY"
MAX_SHUTDOWN_TIMEOUT_S = 86400  # a day; threads cannot wait "forever" (inf)


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "serve",
        help="serve memwall's engine over an OpenAI-compatible HTTP API, with continuous batching",
    )
    parser.add_argument("--model", default="smollm2-135m", help="model name or hub id")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=8000, help="TCP port to listen on, 1-65535 (0: any free one)"
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--dtype", help="fp32, bf16 or fp16 (default: fp32 on CPU, bf16 on CUDA)")
    parser.add_argument(
        "--fast",
        choices=("on", "off"),
        default="on",
        help="on: the device's speed path (accelerate); off: the readable engine, for teaching",
    )
    parser.add_argument(
        "--max-batch", type=int, default=16, help="requests decoded together (default 16)"
    )
    parser.add_argument(
        "--kv-tokens", type=int, default=8192, help="token slots in the paged KV cache (8192)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (16)")
    parser.add_argument(
        "--max-queue", type=int, default=64, help="requests that may wait; more get 503 (64)"
    )
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        help="prefill at most this many prompt tokens per step, between decode steps (0: whole)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM or Ctrl-C, seconds the requests in flight get to finish (30)",
    )
    parser.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on /v1/* (default: ${API_KEY_VARIABLE})",
    )
    parser.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated web origins whose pages may call the API, or '*' (default: none)",
    )
    parser.set_defaults(run=run_serve)


def check_address(host: str, port: int) -> None:
    """A one-line ValueError if the server could not listen on host:port, before the slow load."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be between 1 and 65535 (or 0 for any free port), got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except (socket.gaierror, UnicodeError):
        raise ValueError(
            f"--host {host!r} is not an address or a name this machine can resolve; "
            "use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        ) from None
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself does
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                advice = "something listens there already; choose another --port"
            elif error.errno == errno.EADDRNOTAVAIL:
                advice = (
                    f"{host} is not an address of this machine; use 127.0.0.1 (this machine "
                    "only) or 0.0.0.0 (every interface)"
                )
            elif error.errno == errno.EACCES:
                advice = "ports below 1024 need privileges; choose a --port of 1024 or more"
            else:
                advice = error.strerror or str(error)
            raise ValueError(f"cannot serve on {host}:{port}: {advice}") from None


def log_to_stderr() -> None:
    """The access log and shutdown messages, one line each, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("memwall.serving")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def run_serve(args):
    if args.prefill_chunk < 0 or args.max_batch < 1 or args.max_queue < 0:
        raise ValueError("--prefill-chunk and --max-queue must be >= 0 and --max-batch >= 1")
    if not 1 <= args.block_size <= args.kv_tokens:
        raise ValueError(
            f"--block-size must be >= 1 and --kv-tokens at least one block; got "
            f"--block-size {args.block_size}, --kv-tokens {args.kv_tokens}"
        )
    if not 0 <= args.shutdown_timeout <= MAX_SHUTDOWN_TIMEOUT_S:  # (NaN fails this too)
        raise ValueError(
            f"--shutdown-timeout must be 0 to {MAX_SHUTDOWN_TIMEOUT_S} seconds, "
            f"got {args.shutdown_timeout}"
        )
    check_address(args.host, args.port)
    from memwall.serving.access import Access, is_loopback

    # An empty variable counts as unset; an empty --api-key is refused below.
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_VARIABLE) or None
    origins = [o for o in args.allowed_origins.split(",") if o.strip()]
    Access(api_key, origins)  # a ValueError for an empty key, before the slow load
    if api_key is None and not is_loopback(args.host):
        print(
            f"warning: serving on {args.host} without an API key: anyone who can reach this "
            f"machine may use it (set --api-key or ${API_KEY_VARIABLE})",
            file=sys.stderr,
            flush=True,
        )
    from memwall.bench import harness, workload
    from memwall.engine import shared_engine
    from memwall.engine.accelerate import accelerate
    from memwall.machine.memory import check_fits
    from memwall.serving.server import start_server
    from memwall.serving.shutdown import serve_until_signalled

    device = harness.resolve_device(args.device)
    dtype = harness.resolve_dtype(args.dtype, device)
    hf_model, tokenizer = workload.load_model(args.model, dtype, device)
    if tokenizer is None:
        raise ValueError(f"{args.model!r} has no tokenizer to serve text with; use a real model")
    engine = shared_engine(hf_model)  # read into the engine: never two copies at once
    del hf_model  # the engine holds its own copy of the weights
    kv_bytes = args.kv_tokens * engine.new_cache(batch=1, max_tokens=1).nbytes
    check_fits(kv_bytes, device, f"a KV pool of {args.kv_tokens} tokens",
                       "lower --kv-tokens")  # fmt: skip
    model = accelerate(engine) if args.fast == "on" else engine  # same weights either way
    if hasattr(model, "new_paged_cache"):  # the compiled path: compile before serving
        from memwall.engine.cuda.paged import warm_up

        print("memwall: compiling the decode step (a minute or so)...", file=sys.stderr, flush=True)
        warm_up(model, args.block_size)
    log_to_stderr()
    server = start_server(
        model,
        tokenizer,
        args.model,
        args.host,
        args.port,
        kv_tokens=args.kv_tokens,
        block_size=args.block_size,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk or None,
        engine_thread=False,  # the engine runs in this (main) thread, below
        api_key=api_key,
        allowed_origins=origins,
    )
    # The speed path runs the scheduler's decode steps on its paged cache (the CPU's fused C step
    # in place, the GPU's compiled step as graphs). Where the C step cannot (the C kernels off, a
    # bf16 model), the layers still run this machine's kernels: say so.
    why_not = getattr(model, "fallback_reason", None) if args.fast == "on" else None
    fallback = why_not(server.loop.scheduler.cache) if callable(why_not) else None
    if fallback:
        print(
            "note: --fast on: the layers run this machine's kernels, but not the fused decode "
            f"step ({fallback})",
            file=sys.stderr,
            flush=True,
        )
    shown_host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 address
    chunk = f", prefill chunks of {args.prefill_chunk}" if args.prefill_chunk else ""
    path = "fast path" if args.fast == "on" else "readable engine"
    print(
        f"memwall serving {args.model} on {device} ({dtype}, {path}) at "
        f"http://{shown_host}:{server.server_port}/v1: batches of up to {args.max_batch}, "
        f"{args.kv_tokens} KV slots{chunk} (Ctrl-C or SIGTERM to stop)",
        flush=True,
    )
    try:
        outcome = serve_until_signalled(server, args.shutdown_timeout)
    except BaseException:
        server.shutdown()
        raise
    print(
        f"memwall serve stopped ({outcome.get('signal')}): {outcome.get('finished', 0)} "
        f"request(s) finished, {outcome.get('cut', 0)} cut short",
        flush=True,
    )
    return 0
