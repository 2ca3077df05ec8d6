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
