"""The HTTP side of `memwall serve`: one handler per connection, in a thread of its own.

Routes: GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed as server-sent
events or not), GET /health (503 while shutting down), /stats and /metrics, and OPTIONS for a
browser's CORS preflight. A completion is checked (`api.parse`), handed to the engine thread
(`Service.loop.submit`) and its tokens come back as text (`answer.Answer`) as they are made.

Every request ends in one access-log line on the "memwall.serving" logger (INFO): client, method,
route, status, tokens, seconds. A client that goes away (a failed write, or a closed socket noticed
while waiting) is one such line with status 499, as nginx logs it, never a traceback; its request
is aborted, which frees its KV blocks at the next step boundary.
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler

from memwall.serving import api, metrics
from memwall.serving.answer import Answer, ClientGone, EngineStopped, client_gone
from memwall.serving.engine_loop import QueueFull

log = logging.getLogger("memwall.serving")
MAX_BODY_BYTES = 4 * 2**20  # larger bodies get 413 without being read
# A client that stops sending (or reading) for this long is let go: it would hold a thread.
SOCKET_TIMEOUT_S = 60
RETRY_AFTER_S = 1
CLIENT_GONE = (ConnectionError, TimeoutError)  # BrokenPipeError, ConnectionResetError, ...


def _printable(text: str, limit: int = 200) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def make_handler(service):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = SOCKET_TIMEOUT_S

        def log_message(self, *args):  # the access log is ours: one line per request (_log)
            pass

        def do_GET(self):
            self._handle(self._get)

        def do_POST(self):
            self._handle(self._post)

        def do_OPTIONS(self):
            self._handle(self._preflight)

        def do_PUT(self):
            self._handle(self._not_allowed)

        do_DELETE = do_PATCH = do_PUT

        def send_response(self, code, message=None):
            self.status = code
            super().send_response(code, message)

        def _handle(self, answer):
            self.started_s, self.status, self.gone = time.perf_counter(), None, False
            self.prompt_tokens, self.answer, self.note = None, None, ""
            self.origin = self.headers.get("Origin")
            try:
                try:
                    answer(self.path.split("?", 1)[0].rstrip("/") or "/")
                except api.ApiError as error:
                    self._error(error)  # (which fails too if the client has gone)
            except (ClientGone, *CLIENT_GONE):
                self.gone, self.close_connection = True, True
            except Exception:  # a bug: its traceback goes to the log, the client gets a 500
                log.error("unexpected error on %s %s", self.command, _printable(self.path),
                          exc_info=True)  # fmt: skip
                self.close_connection = True
                if self.status is None:  # nothing sent yet: the answer can still be an error
                    self._error(api.ApiError(500, "internal server error (see the server's log)"))
            finally:
                self._log()

        def _log(self):
            where = f'{self.client_address[0]} "{self.command} {_printable(self.path)}"'
            tokens = ""
            if self.prompt_tokens is not None:
                completion = self.answer.completion_tokens if self.answer else 0
                tokens = f" prompt_tokens={self.prompt_tokens} completion_tokens={completion}"
            seconds = time.perf_counter() - self.started_s
            if self.gone:
                log.info("%s 499 client disconnected%s %.3fs", where, tokens, seconds)
            else:
                log.info("%s %s%s%s %.3fs", where, self.status, tokens, self.note, seconds)

        # ---- routes ----------------------------------------------------------------------------

        def _get(self, route):
            if route == "/metrics":
                stats = service.loop.stats(at_step_boundary=True)
                text = service.loop.metrics.render(stats, service.draining)
                return self._send(200, text.encode(), metrics.CONTENT_TYPE)
            if route == "/health":
                status = {"status": "draining" if service.draining else "ok"}
                return self._json(503 if service.draining else 200, status | service.loop.stats())
            if route == "/stats":
                return self._json(200, service.loop.stats())
            service.access.check_key(route, self.headers.get("Authorization"))
            model = {
                "id": service.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "memwall",
            }
            if route == "/v1/models":
                return self._json(200, {"object": "list", "data": [model]})
            if route.startswith("/v1/models/"):  # one model, as client.models.retrieve asks
                if route.removeprefix("/v1/models/") != service.model_name:
                    raise api.ApiError(
                        404, f"this server serves {service.model_name!r} only",
                        param="model", code="model_not_found",
                    )  # fmt: skip
                return self._json(200, model)
            raise api.ApiError(404, f"no route GET {self.path}", code="not_found")

        def _not_allowed(self, route):
            self.close_connection = True  # a body, if any, is left unread
            raise api.ApiError(405, f"{self.command} is not served; use GET or POST")

        def _preflight(self, route):
            if self.origin is not None and not service.access.allows(self.origin):
                raise api.ApiError(
                    403,
                    f"the origin {self.origin!r} is not allowed; start the server with "
                    f"--allowed-origins {self.origin}",
                    code="origin_not_allowed",
                )
            headers = service.access.preflight_headers(self.origin) or [("Allow", "GET, POST")]
            self._send(204, b"", None, headers)

        def _post(self, route):
            service.access.check_key(route, self.headers.get("Authorization"))
            if route not in ("/v1/completions", "/v1/chat/completions"):
                raise api.ApiError(404, f"no route POST {self.path}", code="not_found")
            body = self._read_json()  # before it counts as in flight: a slow client holds none
            if not service.enter():
                self.close_connection = True
                raise api.ApiError(503, "the server is shutting down", code="server_shutting_down")
            try:
                self._complete_or_stream(route, body)
            finally:
                service.leave()

        def _complete_or_stream(self, route, body):
            try:
                params = service.parse(body, chat=route.endswith("chat/completions"))
                stop_tokens = () if params.ignore_eos or service.eos is None else (service.eos,)
                ticket = service.loop.submit(
                    params.prompt_ids, params.max_tokens, params.sampling, stop_tokens
                )
            except QueueFull as error:
                raise api.ApiError(503, str(error), code="queue_full") from None
            except ValueError as error:
                raise api.bad(str(error)) from None
            self.prompt_tokens = ticket.prompt_tokens
            gone = lambda: client_gone(self.connection)  # noqa: E731
            self.answer = Answer(service, params, ticket, stop_tokens, gone)
            try:
                (self._stream if params.stream else self._complete)(params, ticket)
            except BaseException:  # the client left, or a bug: give the KV blocks back either way
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
            except RecursionError:
                raise api.bad("the request body nests too deeply") from None

        # ---- writing ---------------------------------------------------------------------------

        def _complete(self, params, ticket):
            try:
                pieces = list(self.answer)
            except EngineStopped as stopped:
                return self._error(stopped.error)
            usage = api.usage(ticket.prompt_tokens, self.answer.completion_tokens)
            text, reason = "".join(p for p, _ in pieces), pieces[-1][1]
            request_id = api.new_id(params.chat)
            body = api.completion(params.chat, request_id, service.model_name, text, reason, usage)
            self._json(200, body)

        def _stream(self, params, ticket):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            for name, value in service.access.cors_headers(self.origin):
                self.send_header(name, value)
            self.end_headers()
            self.close_connection = True
            request_id, model, chat = api.new_id(params.chat), service.model_name, params.chat
            first = True
            try:
                for piece, reason in self.answer:
                    if piece or reason is None:  # one chunk per token, for clients that time them
                        self._event(api.chunk(chat, request_id, model, piece, first=first))
                        first = False
                    if reason is not None:
                        self._event(api.chunk(chat, request_id, model, finish_reason=reason))
            except EngineStopped as stopped:  # the final event says why, then [DONE]
                self.note = f" cut short ({stopped.error.code or stopped.error.status})"
                self._event(stopped.error.body())
            if params.include_usage:
                usage = api.usage(ticket.prompt_tokens, self.answer.completion_tokens)
                self._event(api.chunk(chat, request_id, model, token_usage=usage))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _event(self, payload):
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        def _send(self, status, data: bytes, content_type, headers=()):
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in [*headers, *service.access.cors_headers(self.origin)]:
                self.send_header(name, value)
            if self.close_connection or service.draining:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _json(self, status, payload, headers=()):
            self._send(status, json.dumps(payload).encode(), "application/json", headers)

        def _error(self, error: api.ApiError):
            retry = error.code == "queue_full"
            headers = [("Retry-After", str(RETRY_AFTER_S))] if retry else []
            self._json(error.status, error.body(), headers)

    return Handler
