"""`memwall serve`: an OpenAI-compatible HTTP server on the engine's continuous-batching scheduler.

Each HTTP connection gets a thread (stdlib `ThreadingHTTPServer`) running `handler.make_handler`'s
handler, which checks the request, hands it to the one engine thread (`engine_loop.EngineLoop`)
and turns the tokens that come back into text. Concurrent requests are therefore decoded
together, one batched forward pass per step, and the batch changes at step boundaries.

`start_server` starts both and returns the server; `shutdown.drain(server, timeout_s)` stops it
gracefully, and `shutdown.serve_until_signalled` does so on SIGTERM or SIGINT.
"""

from __future__ import annotations

import copy
import logging
import math
import socket
import sys
import threading
from http.server import ThreadingHTTPServer

from memwall.serving import api
from memwall.serving.access import Access
from memwall.serving.engine_loop import EngineLoop
from memwall.serving.handler import CLIENT_GONE, make_handler

log = logging.getLogger("memwall.serving")


class Service:
    """What the handlers share: the engine loop, the tokenizer, the model's name, who may call,
    and the count of completions in flight (a graceful shutdown waits for it to reach 0)."""

    def __init__(self, loop: EngineLoop, tokenizer, model_name: str, vocab_size: int, access):
        self.loop, self.tokenizer, self.model_name = loop, tokenizer, model_name
        self.vocab_size, self.access = vocab_size, access
        self.eos = getattr(tokenizer, "eos_token_id", None)
        # Fast tokenizers are not safe to share freely, so each use holds a lock; reading
        # prompts and writing answers get a tokenizer each, so that a long prompt being
        # tokenized never holds up the tokens streaming to other clients.
        self._tokenizer_lock, self._decoder_lock = threading.Lock(), threading.Lock()
        self._decoder = copy.deepcopy(tokenizer)
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        self.longest_token = max(map(len, vocab), default=0) or None  # characters
        self._flight = threading.Condition()
        self.in_flight, self.draining = 0, False

    def enter(self) -> bool:
        """Count a completion in; False once the server is draining (the caller answers 503)."""
        with self._flight:
            if self.draining:
                return False
            self.in_flight += 1
            return True

    def leave(self) -> None:
        with self._flight:
            self.in_flight -= 1
            self._flight.notify_all()

    def start_draining(self) -> None:
        with self._flight:
            self.draining = True

    def wait_idle(self, timeout_s: float, cut: threading.Event | None = None) -> bool:
        """Wait until no completion is in flight (True), or timeout_s passes, or `cut` is set."""
        with self._flight:
            self._flight.wait_for(
                lambda: self.in_flight == 0 or (cut is not None and cut.is_set()), timeout_s
            )
            return self.in_flight == 0

    def cut_short(self) -> None:
        """Wake wait_idle to look at `cut` again (a signal handler set it)."""
        with self._flight:
            self._flight.notify_all()

    def parse(self, body, chat: bool) -> api.Params:
        with self._tokenizer_lock:
            return api.parse(
                body,
                chat,
                self.tokenizer,
                self.model_name,
                self.loop.max_tokens_per_request,
                self.vocab_size,
                self.longest_token,
            )

    def decode(self, ids) -> str:
        with self._decoder_lock:
            return self._decoder.decode(ids, skip_special_tokens=True)


class OpenAIServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default listen backlog (5) refuses bursts of clients

    def shutdown(self):
        super().shutdown()
        self.loop.close()
        self.server_close()

    def handle_error(self, request, client_address):
        """A client that hung up is one log line; anything else is a bug and keeps its traceback."""
        error = sys.exc_info()[1]
        if isinstance(error, CLIENT_GONE):
            log.info("%s client disconnected (%s)", client_address[0], type(error).__name__)
        else:
            log.error("%s unexpected error", client_address[0], exc_info=True)


class OpenAIServer6(OpenAIServer):
    address_family = socket.AF_INET6  # for --host ::1 and other IPv6 addresses


def start_server(
    engine,
    tokenizer,
    model_name="smollm2-135m",
    host="127.0.0.1",
    port=0,
    *,
    kv_tokens: int = 2048,
    block_size: int = 16,
    max_batch: int = 8,
    max_queue: int = 64,
    prefill_chunk: int | None = None,
    engine_thread: bool = True,
    api_key: str | None = None,
    allowed_origins=(),
) -> OpenAIServer:
    """Serve `engine` in background threads; the port is server.server_port, the engine loop is
    server.loop, and server.shutdown() stops both. The KV cache holds `kv_tokens` token slots,
    allocated (and zeroed) up front: 2 x layers x KV heads x head dim x bytes each.

    engine_thread=False: only the HTTP server gets a thread; the caller then runs the engine with
    `server.loop.run_here()` (faster on a CPU: see `EngineLoop.run_here`).
    api_key: required as `Authorization: Bearer KEY` on /v1/*; allowed_origins: web origins
    whose pages may call the API ("*" for any)."""
    access = Access(api_key, allowed_origins)
    if kv_tokens < block_size:
        raise ValueError(f"kv_tokens ({kv_tokens}) must hold at least one block of {block_size}")
    loop = EngineLoop(
        engine,
        n_blocks=math.ceil(kv_tokens / block_size),
        block_size=block_size,
        max_batch=max_batch,
        max_queue=max_queue,
        prefill_chunk=prefill_chunk,
        background=engine_thread,
    )
    vocab = engine.embed.num_embeddings
    service = Service(loop, tokenizer, model_name, vocab, access)
    try:
        server_class = OpenAIServer6 if ":" in host else OpenAIServer
        server = server_class((host, port), make_handler(service))
    except OSError:
        loop.close()
        raise
    server.loop, server.service = loop, service
    threading.Thread(target=server.serve_forever, name="memwall-http", daemon=True).start()
    return server
