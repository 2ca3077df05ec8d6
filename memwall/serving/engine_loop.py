"""The server's engine thread: one continuous-batching Scheduler, stepped while there is work.

HTTP handler threads never touch the model or the KV cache. They `submit` a request and read its
tokens from a queue (`Ticket.events`), or `abort` it when its client goes away. Submissions and
aborts wait in an inbox that the engine thread drains between steps, so requests join and leave
the running batch only at step boundaries and the scheduler is used by one thread alone.

Admission is the scheduler's: a request runs once the batch has a free place and the paged cache
has free blocks for its prompt. Requests beyond that wait, and at most `max_queue` may wait:
past that `submit` raises QueueFull, which the server answers with 503 and Retry-After.
"""

from __future__ import annotations

import itertools
import queue
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field

from memwall.engine.sampling import Sampling
from memwall.engine.scheduler import Request, Scheduler

HISTORY_STEPS = 100_000  # per-step records kept, so a server that runs for days stays small


class QueueFull(RuntimeError):
    """Every batch place is taken and the waiting queue is full: try again later."""


@dataclass
class Ticket:
    """The handler's side of one request: (token, finish_reason) pairs arrive in `events`, the
    last with a finish reason; ("error", message) if the engine failed."""

    request_id: int
    prompt_tokens: int
    events: queue.Queue = field(default_factory=queue.Queue)


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
        self._aborts: list[int] = []
        self._tickets: dict[int, Ticket] = {}  # touched by the engine thread only
        self._scheduler_waiting = 0  # len(scheduler.waiting) after the last step
        # The last requests that finished (not aborted), with their step counts, for studies.
        self.finished = deque(maxlen=256)
        self._closing = False
        self.failures = 0  # steps that raised (their requests got an error event)
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
            if len(self._inbox) + self._scheduler_waiting >= self.max_queue + self._free_places():
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

    def abort(self, request_id: int) -> None:
        """Drop a request (its client left, or a stop string ended it); its blocks are freed."""
        with self._wake:
            self._aborts.append(request_id)
            self._wake.notify()

    def _free_places(self) -> int:
        return max(0, self.scheduler.max_batch - len(self.scheduler.running))

    def stats(self) -> dict:
        blocks = self.scheduler.cache.blocks
        sizes = self.scheduler.batch_sizes
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting) + len(self._inbox),
            "free_blocks": blocks.n_free,
            "total_blocks": blocks.n_blocks,
            "steps": self.scheduler.step_index,
            "mean_batch": sum(sizes) / len(sizes) if sizes else 0.0,
            "preemptions": self.scheduler.preemptions,
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

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        if not self._started or self._stopped.wait(timeout=30):
            # Free the KV pool now: the HTTP handler classes keep this loop reachable until the
            # garbage collector finds them, and the pool is the biggest thing a server holds.
            cache = self.scheduler.cache
            cache.keys = cache.values = cache.keys.new_empty(0)

    # ---- the engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with self._wake:
                while not (self._inbox or self._aborts or self._closing) and scheduler.idle:
                    self._wake.wait()
                if self._closing:
                    break
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            for request, ticket in inbox:
                try:
                    request.arrival_step = scheduler.step_index  # it joins at this step
                    scheduler.submit(request)
                    self._tickets[ticket.request_id] = ticket
                except ValueError as error:
                    ticket.events.put(("error", str(error)))
            for request_id in aborts:
                scheduler.abort(request_id)
                self._tickets.pop(request_id, None)
            if not scheduler.idle:
                try:
                    scheduler.step()
                except Exception:  # never leave a client waiting forever on a dead engine
                    self._fail_everything(traceback.format_exc(limit=3))
            with self._wake:
                self._scheduler_waiting = len(scheduler.waiting)
            self._trim_history()
        for _, ticket in self._inbox:
            ticket.events.put(("error", "the server shut down"))
        self._fail_everything("the server shut down")

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
        if finish_reason is not None:
            self.finished.append(result)  # before the client can hear that it finished
            del self._tickets[result.request_id]
        ticket.events.put((token, finish_reason))

    def _fail_everything(self, message: str) -> None:
        self.failures += 1
        for entry in [*self.scheduler.waiting, *self.scheduler.running]:
            self.scheduler.abort(entry.request.request_id)
        for ticket in self._tickets.values():
            ticket.events.put(("error", message))
        self._tickets.clear()
