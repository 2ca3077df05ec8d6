"""Helpers for the serving tests: a byte-level tokenizer for the tiny random-weight model, and a
server on 127.0.0.1 that runs it. No model file and no network are needed."""

from __future__ import annotations

import contextlib
import time

from memwall.serving.server import start_server


class ByteTokenizer:
    """One token per byte (latin-1 text is one character per token); `eos_token_id` is chosen by
    the test, or None for a model that never stops on its own."""

    def __init__(self, eos_token_id=None):
        self.eos_token_id = eos_token_id

    def __call__(self, text):
        class Encoding:
            input_ids = list(text.encode("latin-1", errors="replace"))

        return Encoding()

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == self.eos_token_id))

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **_):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
        return self(text).input_ids


@contextlib.contextmanager
def tiny_server(engine, eos_token_id=None, **options):
    """A running server on a free loopback port; yields it (its URL is base_url(server))."""
    options = {"kv_tokens": 2048, "block_size": 8, "max_batch": 8, **options}
    server = start_server(engine, ByteTokenizer(eos_token_id), "tiny", "127.0.0.1", 0, **options)
    try:
        yield server
    finally:
        server.shutdown()


def base_url(server) -> str:
    return f"http://127.0.0.1:{server.server_port}/v1"


def wait_until_idle(server, timeout_s=10.0) -> dict:
    """The engine's stats once nothing runs or waits (or after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.loop.stats()
        if (stats["running"] == 0 and stats["waiting"] == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


@contextlib.contextmanager
def patched_step(server, before_step):
    """Run `before_step()` ahead of every engine step (to slow or hold the engine in a test)."""
    scheduler = server.loop.scheduler
    step = scheduler.step

    def wrapped():
        before_step()
        return step()

    scheduler.step = wrapped
    try:
        yield
    finally:
        del scheduler.step  # back to the class's method


def tiny_engine_for_a_process(seed: int = 0):
    """The tiny random-weight engine, built in a process of its own (as conftest's tiny_engine)."""
    import torch

    from memwall import models
    from memwall.engine import Transformer
    from memwall.specs import ModelSpec

    spec = ModelSpec(
        name="tiny",
        n_layers=3,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=160,
        vocab_size=256,
        tied_embeddings=True,
        max_context=256,
    )
    model = models.random_init(spec, dtype=torch.float32, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return Transformer.from_hf(model)


def main() -> int:
    """`python tests/serving_fixtures.py`: serve the tiny model as `memwall serve` does (engine in
    the main thread, SIGTERM/SIGINT drain it), print "port N", and exit with serve's code."""
    import argparse

    from memwall.serving.cli import log_to_stderr
    from memwall.serving.shutdown import serve_until_signalled

    parser = argparse.ArgumentParser()
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds before each step")
    parser.add_argument("--shutdown-timeout", type=float, default=1.0)
    parser.add_argument("--max-batch", type=int, default=8)
    args = parser.parse_args()
    server = start_server(
        tiny_engine_for_a_process(),
        ByteTokenizer(),
        "tiny",
        "127.0.0.1",
        0,
        kv_tokens=4096,
        block_size=8,
        max_batch=args.max_batch,
        engine_thread=False,
    )
    if args.step_delay:
        scheduler, step = server.loop.scheduler, server.loop.scheduler.step
        scheduler.step = lambda: (time.sleep(args.step_delay), step())[1]
    log_to_stderr()
    print(f"port {server.server_port}", flush=True)
    outcome = serve_until_signalled(server, args.shutdown_timeout)
    print(f"stopped {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
