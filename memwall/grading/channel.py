"""The grader's end of the grading channel: points decided in the grader's own process.

While a student's notebook runs (sandboxed), each of its check cells is a call to
``memwall.exercise_driver.driver.serve``, which connects to a Unix socket that the grader
listens on. For each connection the grader runs the registered check itself (``run_check``),
with hidden cases from its own generator and the reference in its own process; the student's
function is a ``RemoteFunction`` that sends plain inputs and reads a plain value back, with a
per-call time limit. The verdict is the grader's. Each check gets one verdict per notebook:
later connections for it are turned away; a session cut short by a dying kernel gives none, so
a rerun of the notebook can serve that check again.
"""

import builtins
import json
import os
import socket
import threading
import time

from memwall.exercise_driver.values import NotPlain, from_plain, remote_handle, to_plain
from memwall.grading.checking import Verdict, grader_rng, run_check

HELLO_SECONDS = 10.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_TEXT = 2000


class ChannelStop(BaseException):
    """Ends a session; BaseException, so no check's ``except Exception`` can swallow it."""


class CallTimedOut(ChannelStop):
    pass


class ConnectionLost(ChannelStop):
    pass


class BadReply(ChannelStop):
    pass


class RemoteFunction:
    """The student's function, as seen from the grader: plain data in, a plain value out.

    An argument whose class sets ``served_remotely`` (a fake bench) stays here: the student's
    function gets a stand-in, and each of its method calls comes back as an ``invoke`` message
    that runs on the grader's object, so the bench's true timings never reach the student."""

    def __init__(self, connection, name, call_seconds):
        self.connection, self.call_seconds = connection, call_seconds
        self.__name__ = name if name.isidentifier() else "your_function"

    def __call__(self, *args, **kwargs):
        return self.call_plain(args, kwargs)

    def call_plain(self, args, kwargs):
        served = []

        def register(value):
            if not getattr(type(value), "served_remotely", False):
                return None
            served.append((value, remote_handle(len(served), value)))
            return served[-1][1]

        send(self.connection, {"call": to_plain([list(args), dict(kwargs)], remote=register)})
        deadline = time.monotonic() + self.call_seconds  # the bench's calls count in the limit
        reply = receive(self.connection, deadline)
        while reply is not None and "invoke" in reply:
            send(self.connection, invoke(served, reply["invoke"]))
            reply = receive(self.connection, deadline)
        if reply is None:
            raise ConnectionLost()
        if "value" in reply:
            try:
                return from_plain(reply["value"])
            except (NotPlain, RecursionError) as error:
                raise BadReply(f"the result could not be read: {error}") from None
        if "not_implemented" in reply:
            raise NotImplementedError(text(reply["not_implemented"]))
        if "raised" in reply:
            raise remote_exception(text(reply["raised"], 80), text(reply.get("message", "")))
        if "unsendable" in reply:
            raise TypeError(
                f"returned a value the grader cannot read ({text(reply['unsendable'])})"
            )
        if reply.get("interrupted"):
            raise CallTimedOut()
        raise BadReply("the notebook sent a reply the grader does not understand")


class GraderChannel:
    """Listens on ``socket_path`` and judges each check that connects, in a background thread."""

    def __init__(self, socket_path, checks: dict, call_seconds: float):
        self.socket_path, self.checks, self.call_seconds = str(socket_path), checks, call_seconds
        self.verdicts = {}  # check name -> Verdict
        self._stop = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.socket_path)
        os.chmod(self.socket_path, 0o777)  # the sandbox runs under another uid
        self._server.listen(4)
        self._server.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._server.close()

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                connection, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            with connection:
                self._serve(connection)

    def _serve(self, connection):
        hello = _read_hello(connection)
        name = hello.get("hello") if hello else None
        if name not in self.checks or name in self.verdicts:
            _say_done(connection, "nothing to grade here")
            return
        try:
            verdict = self._judge(connection, self.checks[name], hello)
        except ConnectionLost:
            return  # the kernel died mid-check: no verdict, a rerun may serve it again
        self.verdicts[name] = verdict
        _say_done(connection, "handed in" if verdict.passed else verdict.message)

    def _judge(self, connection, spec, hello) -> Verdict:
        if hello.get("callable"):
            answer = RemoteFunction(connection, text(hello.get("function"), 80), self.call_seconds)
        elif "value" in hello:
            try:
                answer = from_plain(hello["value"])
            except (NotPlain, RecursionError) as error:
                return Verdict(False, f"{spec.name}: the answer could not be read ({error})")
        else:
            return Verdict(False, f"{spec.name}: the answer could not be sent to the grader")
        try:
            return run_check(spec, answer, grader_rng(spec.name))
        except CallTimedOut:
            return Verdict(
                False,
                f"{spec.name}: timed out (a call ran over {self.call_seconds:g} s); an endless loop?",
            )
        except BadReply as error:
            return Verdict(False, f"{spec.name}: {error}")


def invoke(served, request) -> dict:
    """Run one method call (or property read) that the student's stand-in sent for a served
    object: ``[id, name, [args, kwargs]]`` or ``[id, name, None]`` to read a property. Only the
    public names of the handle are reachable, and only plain data goes in and out."""
    try:
        number, name, arguments = request
    except (TypeError, ValueError):
        number = name = arguments = None
    if type(number) is not int or not 0 <= number < len(served) or not isinstance(name, str):
        return {"error": ["ValueError", "malformed call on the bench"]}
    value, handle = served[number]
    if name in handle["attributes"] and arguments is None:
        call = lambda: getattr(value, name)  # noqa: E731
    elif name in handle["methods"] and arguments is not None:
        try:
            args, kwargs = from_plain(arguments)
            call = lambda: getattr(value, name)(*args, **kwargs)  # noqa: E731
        except (NotPlain, RecursionError, TypeError, ValueError):
            return {"error": ["ValueError", f"{name}: arguments the grader cannot read"]}
    else:
        return {"error": ["AttributeError", f"{handle['kind']} has no attribute {name!r}"]}
    try:
        return {"result": to_plain(call())}
    except Exception as error:  # the bench's own refusal (a bad size, an unknown format)
        return {"error": [type(error).__name__[:80], str(error)[:MAX_TEXT]]}


def remote_exception(name: str, message: str) -> Exception:
    """An exception named like the student's; a builtin Exception's subclass when it is one,
    so a check may expect, say, a ValueError for bad input."""
    builtin = getattr(builtins, name, None)
    is_builtin = isinstance(builtin, type) and issubclass(builtin, Exception)
    base = builtin if is_builtin else Exception
    return type(name if name.isidentifier() else "Exception", (base,), {})(message)


def send(connection, message):
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        raise ConnectionLost() from None


def receive(connection, deadline):
    """One JSON message, or None when the other side closed; CallTimedOut at the deadline."""
    buffer = bytearray()
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CallTimedOut()
        connection.settimeout(remaining)
        try:
            chunk = connection.recv(1 << 16)
        except TimeoutError:
            raise CallTimedOut() from None
        except OSError:
            return None
        if not chunk:
            return None
        buffer += chunk
        if len(buffer) > MAX_MESSAGE_BYTES:
            raise BadReply("the notebook sent a reply over the size limit")
    try:
        message = json.loads(bytes(buffer[: buffer.index(b"\n")]))
    except (ValueError, RecursionError):
        raise BadReply("the notebook sent a reply that is not JSON") from None
    if not isinstance(message, dict):
        raise BadReply("the notebook sent a reply the grader does not understand")
    return message


def _read_hello(connection):
    try:
        return receive(connection, time.monotonic() + HELLO_SECONDS)
    except ChannelStop:
        return None


def _say_done(connection, message):
    try:
        send(connection, {"done": message[:MAX_TEXT]})
    except ConnectionLost:
        pass


def text(value, limit=MAX_TEXT) -> str:
    return str(value)[:limit]
