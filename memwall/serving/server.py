"""`memwall serve`: an OpenAI-compatible HTTP server on the engine's continuous-batching scheduler.

Endpoints: GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed as server-sent
events or not), plus GET /health and /stats (running, waiting, free KV blocks, mean batch).

Each HTTP connection gets a thread (stdlib `ThreadingHTTPServer`) that checks the request
(`api.parse`), hands it to the one engine thread (`engine_loop.EngineLoop`), and turns the tokens
that come back into text (`text.TextStream`). Concurrent requests are therefore decoded together,
one batched forward pass per step, and the batch changes at step boundaries. A client that goes
away (a failed write, or a closed socket noticed while waiting) has its request aborted, which
frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import json
import math
import queue
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memwall.serving import api
from memwall.serving.engine_loop import EngineLoop, QueueFull
from memwall.serving.text import TextStream

MAX_BODY_BYTES = 4 * 2**20  # larger bodies get 413 without being read
POLL_S = 0.2  # how often a waiting handler checks whether its client is still there
RETRY_AFTER_S = 1


class ClientGone(Exception):
    pass


class Service:
    """What the handlers share: the engine loop, the tokenizer and the model's name."""

    def __init__(self, loop: EngineLoop, tokenizer, model_name: str, vocab_size: int):
        self.loop, self.tokenizer, self.model_name = loop, tokenizer, model_name
        self.vocab_size = vocab_size
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self._tokenizer_lock = threading.Lock()  # fast tokenizers are not safe to share freely

    def parse(self, body, chat: bool) -> api.Params:
        with self._tokenizer_lock:
            return api.parse(
                body,
                chat,
                self.tokenizer,
                self.model_name,
                self.loop.max_tokens_per_request,
                self.vocab_size,
            )

    def decode(self, ids) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)


def make_handler(service: Service):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test and benchmark output clean
            pass

        def do_GET(self):
            route = self.path.rstrip("/")
            if route == "/v1/models":
                model = {"id": service.model_name, "object": "model", "owned_by": "memwall"}
                return self._json(200, {"object": "list", "data": [model | {"created": 0}]})
            if route in ("/health", "/stats"):
                return self._json(200, service.loop.stats())
            self._error(api.ApiError(404, f"no route GET {self.path}", code="not_found"))

        def do_POST(self):
            route = self.path.rstrip("/")
            if route not in ("/v1/completions", "/v1/chat/completions"):
                return self._error(
                    api.ApiError(404, f"no route POST {self.path}", code="not_found")
                )
            try:
                params = service.parse(self._read_json(), chat=route.endswith("chat/completions"))
                stop_tokens = () if params.ignore_eos or service.eos is None else (service.eos,)
                ticket = service.loop.submit(
                    params.prompt_ids, params.max_tokens, params.sampling, stop_tokens
                )
            except api.ApiError as error:
                return self._error(error)
            except QueueFull as error:
                return self._error(api.ApiError(503, str(error), code="queue_full"), retry=True)
            except ValueError as error:
                return self._error(api.bad(str(error)))
            try:
                (self._stream if params.stream else self._complete)(params, ticket, stop_tokens)
            except (ClientGone, BrokenPipeError, ConnectionResetError, TimeoutError):
                service.loop.abort(ticket.request_id)
                self.close_connection = True
            except Exception:  # a bug: still give the request's KV blocks back
                service.loop.abort(ticket.request_id)
                raise

        # ---- reading ---------------------------------------------------------------------------

        def _read_json(self):
            if "chunked" in self.headers.get("Transfer-Encoding", ""):
                self.close_connection = True
                raise api.ApiError(411, "send the body with a Content-Length, not chunked")
            try:
                length = int(self.headers.get("Content-Length", 0))
            except ValueError:
                raise api.bad("bad Content-Length header") from None
            if length > MAX_BODY_BYTES:
                self.close_connection = True  # the body is left unread
                raise api.ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
            raw = self.rfile.read(length) if length > 0 else b""
            try:
                return json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise api.bad(f"the request body is not valid JSON: {error}") from None

        def _events(self, ticket):
            """(token, finish_reason) pairs until the last; ClientGone if the client left first."""
            while True:
                try:
                    event = ticket.events.get(timeout=POLL_S)
                except queue.Empty:
                    if self._client_gone():
                        raise ClientGone from None
                    continue
                if event[0] == "error":
                    raise RuntimeError(event[1])
                yield event
                if event[1] is not None:
                    return

        def _client_gone(self) -> bool:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0)
                return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def _pieces(self, params, ticket, stop_tokens):
            """(text piece, finish_reason or None), ending with a finish reason; the tokens made
            so far are counted in self.completion_tokens."""
            text, self.completion_tokens = TextStream(service.decode, params.stop), 0
            for token, reason in self._events(ticket):
                self.completion_tokens += 1
                piece = "" if reason == "stop" and token in stop_tokens else text.add(token)
                if text.stopped:  # a stop string: the engine may stop working on it
                    service.loop.abort(ticket.request_id)
                    yield piece, "stop"
                    return
                if reason is not None:
                    yield piece + text.flush(), reason
                    return
                yield piece, None

        # ---- writing ---------------------------------------------------------------------------

        def _complete(self, params, ticket, stop_tokens):
            try:
                pieces = list(self._pieces(params, ticket, stop_tokens))
            except RuntimeError as error:
                return self._error(api.ApiError(500, f"the engine failed: {error}"))
            usage = api.usage(ticket.prompt_tokens, self.completion_tokens)
            text, reason = "".join(p for p, _ in pieces), pieces[-1][1]
            request_id = api.new_id(params.chat)
            body = api.completion(params.chat, request_id, service.model_name, text, reason, usage)
            self._json(200, body)

        def _stream(self, params, ticket, stop_tokens):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            request_id, model, chat = api.new_id(params.chat), service.model_name, params.chat
            first, self.completion_tokens = True, 0
            try:
                for piece, reason in self._pieces(params, ticket, stop_tokens):
                    if piece or reason is None:  # one chunk per token, for clients that time them
                        self._event(api.chunk(chat, request_id, model, piece, first=first))
                        first = False
                    if reason is not None:
                        self._event(api.chunk(chat, request_id, model, finish_reason=reason))
            except RuntimeError as error:
                self._event(api.ApiError(500, f"the engine failed: {error}").body())
            if params.include_usage:
                usage = api.usage(ticket.prompt_tokens, self.completion_tokens)
                self._event(api.chunk(chat, request_id, model, token_usage=usage))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, payload):
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        def _json(self, status, payload, headers=()):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers:
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _error(self, error: api.ApiError, retry=False):
            headers = [("Retry-After", str(RETRY_AFTER_S))] if retry else []
            self._json(error.status, error.body(), headers)

    return Handler


class OpenAIServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default listen backlog (5) refuses bursts of clients

    def shutdown(self):
        super().shutdown()
        self.loop.close()
        self.server_close()


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
) -> OpenAIServer:
    """Serve `engine` in background threads; the port is server.server_port, the engine loop is
    server.loop, and server.shutdown() stops both. The KV cache holds `kv_tokens` token slots,
    allocated (and zeroed) up front: 2 x layers x KV heads x head dim x bytes each.

    engine_thread=False: only the HTTP server gets a thread; the caller then runs the engine with
    `server.loop.run_here()` (faster on a CPU: see `EngineLoop.run_here`)."""
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
    try:
        server = OpenAIServer(
            (host, port), make_handler(Service(loop, tokenizer, model_name, vocab))
        )
    except OSError:
        loop.close()
        raise
    server.loop = loop
    threading.Thread(target=server.serve_forever, name="memwall-http", daemon=True).start()
    return server
