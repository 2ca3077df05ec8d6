"""Graceful shutdown: what `memwall serve` does on SIGTERM (docker stop, Kubernetes, systemd) or
Ctrl-C (SIGINT), as a deployed server must.

1. Stop taking work: a new completion gets 503 with code "server_shutting_down" and `/health`
   answers 503, so a load balancer takes the server out of rotation.
2. Let the completions in flight finish, for up to `timeout_s` seconds.
3. End the rest: each stream gets a final error event that says why, then `data: [DONE]` (a client
   can never take a cut answer for a whole one), each unstreamed request a 503; the engine aborts
   them all, which frees their KV blocks.
4. Close the listening socket; `memwall serve` then exits 0.
A second signal cuts step 2 short.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("memwall.serving")
CUT_GRACE_S = 5.0  # for the cut requests' handlers to write their last event
SHUTDOWN_MESSAGE = "the server is shutting down"


def drain(server, timeout_s: float, hurry: threading.Event | None = None) -> dict:
    """Shut `server` (from start_server) down gracefully; returns how many completions finished
    in the grace period and how many were cut. Blocks until the server is closed."""
    service = server.service
    service.start_draining()
    in_flight = service.in_flight
    service.wait_idle(timeout_s, hurry)
    cut = service.in_flight
    server.loop.close(SHUTDOWN_MESSAGE)  # every request still there ends with a "shutdown" event
    service.wait_idle(CUT_GRACE_S)
    server.shutdown()
    return {"finished": max(0, in_flight - cut), "cut": cut}


def serve_until_signalled(server, timeout_s: float, run_engine_here: bool = True) -> dict:
    """Serve until SIGTERM or SIGINT, then `drain`; returns drain's counts and the signal. Call it from the main
    thread (signals are delivered there). run_engine_here: the engine loop runs in this thread
    (start_server(..., engine_thread=False))."""
    hurry, drained, outcome = threading.Event(), threading.Event(), {}

    def drain_in_background():
        try:
            outcome.update(drain(server, timeout_s, hurry))
        finally:
            drained.set()

    def on_signal(signum, _frame):
        # A handler runs between two bytecodes of the main thread, which may be inside a step:
        # it only starts the drain (or hurries it), in a thread of its own.
        name = signal.Signals(signum).name
        if "signal" in outcome:
            log.warning("%s again: ending the requests in flight now", name)
            hurry.set()
            server.service.cut_short()
            return
        outcome["signal"] = name
        log.warning(
            "%s: shutting down; %d request(s) in flight get up to %gs to finish",
            name,
            server.service.in_flight,
            timeout_s,
        )
        threading.Thread(target=drain_in_background, name="memwall-drain", daemon=True).start()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if run_engine_here:
            server.loop.run_here()  # returns once drain() has closed the loop
        drained.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return outcome
