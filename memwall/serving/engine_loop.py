"""The server's engine thread: one continuous-batching Scheduler, stepped while there is work.

HTTP handler threads never touch the model or the KV cache. They `submit` a request and read its
tokens from a queue (`Ticket.events`), or `abort` it when its client goes away. Submissions and
aborts wait in an inbox that the engine thread drains between steps, so requests join and leave
the running batch only at step boundaries and the scheduler is used by one thread alone.

Admission is the scheduler's: a request runs once the batch has a free place and the paged cache
has free blocks for its prompt. Requests beyond that wait, and at most `max_queue` may wait:
past that `submit` raises QueueFull, which the server answers with 503 and Retry-After.

`close()` ends every request still here with a ("shutdown", message) event and frees its blocks:
a graceful shutdown calls it once the requests in flight had their time to finish. The loop feeds
`metrics` (ServingMetrics) as tokens are made: `/metrics` reads it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from memwall.engine.sampling import Sampling
from memwall.engine.scheduler import Request, Scheduler
from memwall.serving.metrics import ServingMetrics

log = logging.getLogger("memwall.serving")
HISTORY_STEPS = 100_000  # per-step records kept, so a server that runs for days stays small


class QueueFull(RuntimeError):
    """Every batch place is taken and the waiting queue is full: try again later."""


@dataclass
class Ticket:
    """The handler's side of one request: (token, finish_reason) pairs arrive in `events`, the
    last with a finish reason; ("error", message) if the engine failed, ("shutdown", message) if
    the server ended it."""

    request_id: int
    prompt_tokens: int
    events: queue.Queue = field(default_factory=queue.Queue)
    arrival_s: float = field(default_factory=time.perf_counter)
    last_token_s: float | None = None  # engine thread only, as the two fields below
    tokens: int = 0


class EngineLoop:
    def __init__(
        self,
        model,
        n_blocks: int,
        block_size: int = 16,
        max_batch: int = 8,
        max_queue: int = 64,
        prefill_chunk: int | None = None,
        background: bool = True,
    ):
        """background=False: no thread is started; the caller runs the loop with `run_here()`."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.scheduler = Scheduler(
            model,
            n_blocks,
            block_size,
            max_batch,
            prefill_chunk=prefill_chunk,
            on_token=self._on_token,
        )
        self.max_queue = max_queue
        self._ids = itertools.count()
        self._wake = threading.Condition()
        self._inbox: list[tuple[Request, Ticket]] = []
        self._aborts: list[tuple[int, str]] = []
        self._tickets: dict[int, Ticket] = {}  # touched by the engine thread only
        self._publish()  # the counts other threads read (stats), as of the last step
        # The last requests that finished (not aborted), with their step counts, for studies.
        self.finished = deque(maxlen=256)
        self._closing = False
        self.failures = 0  # steps that raised (their requests got an error event)
        self.metrics = ServingMetrics()
        self._close_message = "the server shut down"
        self._started, self._stopped = False, threading.Event()
        self._thread = None
        if background:
            self._started = True  # before the thread runs, so an early close() waits for it
            self._thread = threading.Thread(
                target=self.run_here, name="memwall-engine", daemon=True
            )
            self._thread.start()

    @property
    def max_tokens_per_request(self) -> int:
        return self.scheduler.max_tokens_per_request

    def submit(self, prompt_ids, max_new_tokens, sampling=Sampling(), stop_tokens=()) -> Ticket:
        """Queue a request for the engine thread; QueueFull if too many are waiting already."""
        with self._wake:
            if self._closing:
                raise QueueFull("the server is shutting down")
            if len(self._inbox) + self._counts["scheduler_waiting"] >= (
                self.max_queue + self._free_places()
            ):
                raise QueueFull(f"{self.max_queue} requests are already waiting")
            ticket = Ticket(next(self._ids), len(prompt_ids))
            request = Request(
                ticket.request_id,
                list(prompt_ids),
                max_new_tokens,
                stop_tokens=tuple(stop_tokens),
                sampling=sampling,
            )
            self._inbox.append((request, ticket))
            self._wake.notify()
        return ticket

    def abort(self, request_id: int, reason: str = "abort") -> None:
        """Drop a request; its blocks are freed. reason: "abort" (the client left) or "stop" (a
        stop string ended it), as /metrics counts it."""
        with self._wake:
            self._aborts.append((request_id, reason))
            self._wake.notify()

    def _free_places(self) -> int:
        return max(0, self.scheduler.max_batch - self._counts["running"])

    def stats(self, at_step_boundary: bool = False) -> dict:
        """Running and waiting requests, free KV blocks, ...: as of the last step boundary, with
        the requests submitted since as waiting; at_step_boundary=True: all as of that boundary
        (what /metrics shows, as vLLM's do: a request that finished in the step under way and
        its client's next one are then never counted both)."""
        sizes = self.scheduler.batch_sizes
        with self._wake:
            counts, inbox = dict(self._counts), len(self._inbox)
        if at_step_boundary:
            inbox = counts["inbox"]
        waiting = counts.pop("scheduler_waiting") + inbox
        del counts["inbox"]
        return counts | {
            "waiting": waiting,
            "mean_batch": sum(sizes) / len(sizes) if sizes else 0.0,
            "failures": self.failures,
        }

    def run_here(self) -> None:
        """Run the engine loop in the calling thread until `close()`.

        `memwall serve` runs it in the main thread. GNU OpenMP gives every thread that starts
        parallel regions a worker pool of its own, and once there are more pool threads than
        cores it stops spin-waiting between regions: a decode step that took 19 ms in the main
        thread took 30 ms in a second thread of the same process (2 cores)."""
        self._started = True
        try:
            self._run()
        finally:
            self._stopped.set()

    def close(self, message: str = "the server shut down") -> None:
        """Stop the loop; every request still here gets ("shutdown", message) and its blocks."""
        with self._wake:
            if not self._closing:
                self._closing, self._close_message = True, message
            self._wake.notify()
        if not self._started or self._stopped.wait(timeout=30):
            # Free the KV pool now: the HTTP handler classes keep this loop reachable until the
            # garbage collector finds them, and the pool is the biggest thing a server holds.
            cache = self.scheduler.cache
            cache.keys = cache.values = None

    # ---- the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._wake:
                while not (self._inbox or self._aborts or self._closing) and scheduler.idle:
                    self._wake.wait()
                if self._closing:
                    break
                # Under the lock (these are quick), so stats() never misses a request in transit.
                self._take_inbox_and_aborts()
                self._publish()
            if not scheduler.idle:
                try:
                    scheduler.step()
                except Exception as error:  # never leave a client waiting on a dead engine
                    self.failures += 1
                    log.error("the engine's step failed", exc_info=True)  # the server's log
                    self._end_everything("error", f"{type(error).__name__}: {error}")
            with self._wake:
                self._publish()
            self._trim_history()
        with self._wake:
            inbox, self._inbox = self._inbox, []
        for _, ticket in inbox:
            ticket.events.put(("shutdown", self._close_message))
        self._end_everything("shutdown", self._close_message)
        with self._wake:
            self._publish()

    def _take_inbox_and_aborts(self) -> None:
        scheduler = self.scheduler
        inbox, self._inbox = self._inbox, []
        aborts, self._aborts = self._aborts, []
        for request, ticket in inbox:
            try:
                request.arrival_step = scheduler.step_index  # it joins at this step
                scheduler.submit(request)
                self._tickets[ticket.request_id] = ticket
                self.metrics.admitted(ticket.prompt_tokens)
            except ValueError as error:
                ticket.events.put(("error", str(error)))
        for request_id, reason in aborts:
            scheduler.abort(request_id)
            ticket = self._tickets.pop(request_id, None)
            if ticket is not None:  # (not when it had finished already)
                self._ended(ticket, reason)

    def _publish(self) -> None:
        """Copy the scheduler's counts for other threads (call with the lock held): read in the
        middle of a step, they could count a request that just finished as running still."""
        scheduler, blocks = self.scheduler, self.scheduler.cache.blocks
        self._counts = {
            "running": len(scheduler.running),
            "scheduler_waiting": len(scheduler.waiting),
            "inbox": len(self._inbox),
            "free_blocks": blocks.n_free,
            "total_blocks": blocks.n_blocks,
            "steps": scheduler.step_index,
            "preemptions": scheduler.preemptions,
        }

    def _trim_history(self) -> None:
        scheduler = self.scheduler
        for record in (
            scheduler.batch_sizes,
            scheduler.step_times_s,
            scheduler.memory,
            scheduler.reserved_if_contiguous,
        ):
            if len(record) > HISTORY_STEPS:
                del record[: len(record) - HISTORY_STEPS // 2]

    def _on_token(self, result, token, finish_reason) -> None:
        ticket = self._tickets.get(result.request_id)
        if ticket is None:
            return
        now = time.perf_counter()
        self.metrics.token(now - (ticket.last_token_s or ticket.arrival_s), ticket.tokens == 0)
        ticket.last_token_s, ticket.tokens = now, ticket.tokens + 1
        if finish_reason is not None:
            self.finished.append(result)  # before the client can hear that it finished
            del self._tickets[result.request_id]
            self._ended(ticket, finish_reason)
        ticket.events.put((token, finish_reason))

    def _ended(self, ticket: Ticket, reason: str) -> None:
        self.metrics.ended(reason, time.perf_counter() - ticket.arrival_s)

    def _end_everything(self, kind: str, message: str) -> None:
        """Abort every request (their blocks are freed) and tell each client why."""
        for entry in [*self.scheduler.waiting, *self.scheduler.running]:
            self.scheduler.abort(entry.request.request_id)
        for ticket in self._tickets.values():
            self._ended(ticket, kind)
            ticket.events.put((kind, message))
        self._tickets.clear()
