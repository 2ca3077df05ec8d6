"""One request's answer: the engine's token events turned into text pieces and a finish reason.

The engine thread puts (token, finish_reason) pairs in the request's `Ticket.events`. `Answer`
reads them, detokenizes (`text.TextStream`, which also holds back what may be the start of a stop
string), and yields (text piece, finish_reason or None) pairs, the last with a finish reason. Every
POLL_S it checks that the client is still there, even while tokens keep coming (an unstreamed
answer writes nothing until the end, so no failed write would tell): if not, it raises ClientGone,
and the caller aborts the request so that its KV blocks are freed.
"""

from __future__ import annotations

import queue
import select
import socket
import time

from memwall.serving import api
from memwall.serving.text import TextStream

POLL_S = 0.2  # how often a waiting handler checks whether its client is still there


class ClientGone(Exception):
    pass


class EngineStopped(Exception):
    """The engine ended the request before its last token: it failed, or the server shuts down."""

    def __init__(self, error: api.ApiError):
        super().__init__(error.message)
        self.error = error


def client_gone(connection: socket.socket) -> bool:
    """True once the client has closed its side (a readable socket with nothing to read)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Answer:
    """Iterate for (text piece, finish_reason or None); `completion_tokens` counts the tokens so far.

    service: the server's Service (decode, loop); gone: a callable, True once the client left."""

    def __init__(self, service, params: api.Params, ticket, stop_tokens, gone):
        self.service, self.params, self.ticket = service, params, ticket
        self.stop_tokens, self.gone = stop_tokens, gone
        self.completion_tokens = 0

    def __iter__(self):
        text = TextStream(self.service.decode, self.params.stop)
        for token, reason in self._events():
            self.completion_tokens += 1
            piece = "" if reason == "stop" and token in self.stop_tokens else text.add(token)
            if text.stopped:  # a stop string: the engine may stop working on it
                self.service.loop.abort(self.ticket.request_id, reason="stop")
                yield piece, "stop"
                return
            if reason is not None:
                yield piece + text.flush(), reason
                return
            yield piece, None

    def _events(self):
        """(token, finish_reason) pairs until the last; ClientGone if the client left first,
        EngineStopped if the engine ended the request."""
        checked = time.monotonic()
        while True:
            try:
                event = self.ticket.events.get(timeout=POLL_S)
            except queue.Empty:
                event = None
            if time.monotonic() - checked >= POLL_S:
                if self.gone():
                    raise ClientGone
                checked = time.monotonic()
            if event is None:
                continue
            if event[0] == "error":
                raise EngineStopped(api.ApiError(500, f"the engine failed: {event[1]}"))
            if event[0] == "shutdown":
                message = f"{event[1]}: the request was cut short"
                raise EngineStopped(api.ApiError(503, message, code="server_shutting_down"))
            yield event
            if event[1] is not None:
                return
