"""`memwall serve`: start the OpenAI-compatible, continuously batching server on a model.

(`memwall bench serve`, which measures any such server, lives in memwall.bench.serve.)
"""

from __future__ import annotations

import socket


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "serve",
        help="serve memwall's engine over an OpenAI-compatible HTTP API, with continuous batching",
    )
    parser.add_argument("--model", default="smollm2-135m", help="model name or hub id")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--dtype", help="fp32, bf16 or fp16 (default: fp32 on CPU, bf16 on CUDA)")
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
    parser.set_defaults(run=run_serve)


def ensure_port_free(host: str, port: int) -> None:
    """A ValueError naming the port when something already listens there, before the slow load."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server itself does
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ValueError(
                f"cannot serve on {host}:{port}: {error.strerror}; choose another --port."
            ) from None


def run_serve(args):
    ensure_port_free(args.host, args.port)
    from memwall.bench import harness, workload
    from memwall.engine import shared_engine
    from memwall.serving.server import start_server

    if args.prefill_chunk < 0 or args.max_batch < 1 or args.max_queue < 0:
        raise ValueError("--prefill-chunk and --max-queue must be >= 0 and --max-batch >= 1")
    device = harness.resolve_device(args.device)
    dtype = harness.resolve_dtype(args.dtype, device)
    hf_model, tokenizer = workload.load_model(args.model, dtype, device)
    if tokenizer is None:
        raise ValueError(f"{args.model!r} has no tokenizer to serve text with; use a real model")
    engine = shared_engine(hf_model)  # read into the engine: never two copies at once
    del hf_model  # the engine holds its own copy of the weights
    server = start_server(
        engine,
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
    )
    chunk = f", prefill chunks of {args.prefill_chunk}" if args.prefill_chunk else ""
    print(
        f"memwall serving {args.model} on {device} ({dtype}) at "
        f"http://{args.host}:{server.server_port}/v1: batches of up to {args.max_batch}, "
        f"{args.kv_tokens} KV slots{chunk} (Ctrl-C to stop)",
        flush=True,
    )
    try:
        server.loop.run_here()  # until Ctrl-C; the HTTP server answers from its own threads
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0
