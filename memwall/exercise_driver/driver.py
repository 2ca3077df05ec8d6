"""``serve(name, answer)``: what a check cell becomes while the grader runs the notebook.

The grader listens on a Unix socket in the notebook's scratch folder (its path is in
``MEMWALL_GRADER_CHANNEL``). ``serve`` connects, says which check it serves, then answers the
grader's calls one by one: each call carries plain inputs, ``serve`` calls the student's
function on them and sends back a plain result or the exception it raised. The grader draws the
hidden cases and judges the results itself; nothing sent from here can claim a pass.

Messages are one JSON object per line:

    kernel -> grader  {"hello": "ch01.ttft", "function": "ttft_ms", "callable": true}
    grader -> kernel  {"call": [args, kwargs]}          (both through values.to_plain)
    while the call runs, for each method call on a bench that stays in the grader:
      kernel -> grader  {"invoke": [id, "run_a", [args, kwargs]]}   (None: read a property)
      grader -> kernel  {"result": ...} | {"error": ["ValueError", "..."]}
    kernel -> grader  {"value": ...} | {"raised": "ValueError", "message": "..."}
                      | {"not_implemented": "..."} | {"unsendable": "..."} | {"interrupted": true}
    grader -> kernel  {"done": "one line for the student"}
"""

import builtins
import json
import os
import signal
import socket

from memwall.exercise_driver.values import NotPlain, from_plain, to_plain

CHANNEL_VARIABLE = "MEMWALL_GRADER_CHANNEL"
CALL_LIMIT_VARIABLE = "MEMWALL_CALL_TIME_LIMIT"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_TEXT = 2000


class CallTimeLimit(BaseException):
    """Raised inside the student's function when one call runs past the per-call limit."""


def serve(name, answer):
    """Answer the grader's calls for the check ``name`` with ``answer`` (usually a function)."""
    path = os.environ.get(CHANNEL_VARIABLE)
    if not path:
        raise RuntimeError("serve() only runs under `memwall grade`; use check() in a notebook")
    limit = float(os.environ.get(CALL_LIMIT_VARIABLE) or 0)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    try:
        with connection, connection.makefile("rwb") as stream:
            _send(stream, hello(name, answer))
            while True:
                message = _receive(stream)
                if message is None or "done" in message:
                    print(f"{name}: {str((message or {}).get('done', 'handed in'))[:MAX_TEXT]}")
                    return
                # built objects stay in the grader: they arrive as handles, never as specs
                args, kwargs = from_plain(
                    message.get("call"), remote=lambda handle: GraderObject(stream, handle)
                )
                _send(stream, call_once(answer, args, kwargs, limit))
    except (BrokenPipeError, ConnectionResetError):
        print(f"{name}: the grader ended this check (a call ran over its time limit?)")


class GraderObject:
    """Stands in for an object that stays in the grader (a fake bench): its public methods and
    properties are calls over the channel, and nothing else of it is here to read."""

    def __init__(self, stream, handle):
        self.__stream, self.__handle = stream, handle

    def __getattr__(self, name):
        if name.startswith("_"):  # private names are not served (and copy/pickle probe them)
            raise AttributeError(name)
        handle = self.__handle
        if name in handle["methods"]:
            return lambda *args, **kwargs: self.__invoke(name, [list(args), kwargs])
        if name in handle["attributes"]:
            return self.__invoke(name, None)
        raise AttributeError(f"{handle['kind']} has no attribute {name!r}")

    def __invoke(self, name, arguments):
        plain = None if arguments is None else to_plain(arguments)
        _send(self.__stream, {"invoke": [self.__handle["id"], name, plain]})
        reply = _receive(self.__stream)
        if reply is None or "done" in reply:
            raise ConnectionError("the grader ended this check")
        if "result" in reply:
            return from_plain(reply["result"])
        kind, message = (list(reply.get("error") or []) + ["RuntimeError", ""])[:2]
        raise _exception(str(kind), str(message))

    def __dir__(self):
        return sorted(self.__handle["methods"] + self.__handle["attributes"])

    def __repr__(self):
        return f"<{self.__handle['kind']} on the grader's fake clock>"


def _exception(kind: str, message: str) -> Exception:
    """The bench's error with its builtin type where it has one (ValueError for a bad size)."""
    builtin = getattr(builtins, kind, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        return builtin(message)
    return RuntimeError(f"{kind}: {message}")


def hello(name, answer) -> dict:
    if callable(answer):
        function = str(getattr(answer, "__name__", "your_function"))[:80]
        return {"hello": name, "function": function, "callable": True}
    try:
        return {"hello": name, "callable": False, "value": to_plain(answer)}
    except NotPlain as error:
        return {"hello": name, "callable": False, "unsendable": str(error)[:MAX_TEXT]}


def call_once(function, args, kwargs, limit) -> dict:
    """Call the student's function once; the reply says what came of it."""
    previous = _arm(limit)
    try:
        result = function(*args, **kwargs)
    except NotImplementedError as error:
        return {"not_implemented": str(error)[:MAX_TEXT]}
    except CallTimeLimit:
        return {"interrupted": True}
    except KeyboardInterrupt:
        raise  # the cell timeout: let nbval see it
    except Exception as error:
        return {"raised": type(error).__name__[:80], "message": str(error)[:MAX_TEXT]}
    finally:
        _disarm(previous)
    try:
        return {"value": to_plain(result)}
    except NotPlain as error:
        return {"unsendable": str(error)[:MAX_TEXT]}


def _arm(limit):
    if limit <= 0:
        return None

    def stop(signum, frame):
        raise CallTimeLimit()

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, limit)
    return previous


def _disarm(previous):
    if previous is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _send(stream, message):
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def _receive(stream):
    line = stream.readline(MAX_MESSAGE_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_MESSAGE_BYTES:
        raise RuntimeError("the grader's message is too long")
    return json.loads(line)


def harden():
    """No ptrace, no /proc/<pid>/mem and no core dumps for this process (Linux only)."""
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass
    try:
        import ctypes

        pr_set_dumpable = 4
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_dumpable, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass
