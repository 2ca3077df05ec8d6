"""Continuous batching (Yu et al. 2022, "Orca") on the paged KV cache (Kwon et al. 2023).

Static batching takes B requests, decodes until the *last* of them finishes, and only then takes
the next B. Finished requests hold their slots idle and new arrivals queue behind the slowest one.
Continuous (iteration-level) batching schedules every step: a request that finishes leaves at once
and a waiting one joins at the next step, so the batch stays full without ever draining.

One `step()` here does, in order:
1. one batched decode step for every running request (one token each); requests that hit a stop
   token or their max_new_tokens retire at once and their blocks go back to the free list;
2. admit waiting requests (first come, first served) while the batch has room and the cache has
   blocks for their prompt; each is prefilled on its own, yields its first token, and decodes with
   the others from the next step on.
If a decode step needs a block and none is free, the most recently admitted request is preempted:
its blocks are freed and it goes back to the front of the queue with the tokens it has generated,
to be prefilled again later (vLLM's "recompute" preemption). A request is never dropped: either it
finishes or `submit` refuses it up front, because its prompt plus max_new_tokens can never fit.
Greedy decoding only, so every request's output equals decoding it alone.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from memwall.engine.block_manager import MemoryUse, OutOfBlocks
from memwall.engine.paged_cache import PagedKVCache

MODES = ("continuous", "static")


@dataclass
class Request:
    request_id: object
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int = 0  # the step at which it arrives (used by `run`)
    stop_tokens: tuple = ()


@dataclass
class Result:
    request_id: object
    tokens: list[int] = field(default_factory=list)
    error: str | None = None  # why it was rejected; None if it ran
    arrival_step: int = 0
    first_token_step: int | None = None
    finish_step: int | None = None
    preemptions: int = 0


@dataclass
class _Running:
    request: Request
    result: Result
    admitted_step: int


class Scheduler:
    def __init__(
        self,
        model,
        n_blocks: int,
        block_size: int = 16,
        max_batch: int = 8,
        mode: str = "continuous",
    ):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.mode, self.max_batch = model, mode, max_batch
        self.cache = PagedKVCache.for_model(model, n_blocks, block_size)
        self.device = next(model.parameters()).device
        self.waiting: deque[_Running] = deque()
        self.running: list[_Running] = []
        self.step_index = 0
        self.batch_sizes: list[int] = []  # decoding requests per step
        self.step_times_s: list[float] = []
        self.memory: list[MemoryUse] = []  # after each step
        self.reserved_if_contiguous: list[int] = []  # slots a max-length reservation would hold

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, request: Request) -> Result:
        """Queue a request; raise ValueError if it could never run (nothing else is affected)."""
        prompt, new = len(request.prompt), request.max_new_tokens
        if prompt == 0:
            raise ValueError(f"request {request.request_id!r}: the prompt is empty")
        if new < 1:
            raise ValueError(
                f"request {request.request_id!r}: max_new_tokens must be >= 1, got {new}"
            )
        if any(r.request.request_id == request.request_id for r in (*self.waiting, *self.running)):
            raise ValueError(f"request id {request.request_id!r} is already queued or running")
        limit = min(self.cache.blocks.capacity_tokens, self.model.max_positions)
        if prompt + new > limit:
            raise ValueError(
                f"request {request.request_id!r} can never fit: prompt ({prompt}) + max_new_tokens "
                f"({new}) = {prompt + new} tokens, but the KV cache holds at most {limit} "
                f"({self.cache.blocks.n_blocks} blocks of {self.cache.blocks.block_size}, model "
                f"context {self.model.max_positions}). Shorten it or give the cache more blocks."
            )
        result = Result(request.request_id, arrival_step=request.arrival_step)
        self.waiting.append(_Running(request, result, admitted_step=-1))
        return result

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- one step ------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Result]:
        """Admit, prefill, decode and retire once; return the requests that finished."""
        start = time.perf_counter()
        finished = (
            self._decode()
        )  # the requests already running decode first: newcomers got a token in prefill
        finished += self._admit()
        self.step_times_s.append(time.perf_counter() - start)
        self.memory.append(self.cache.blocks.memory_use())
        self.reserved_if_contiguous.append(
            sum(len(r.request.prompt) + r.request.max_new_tokens for r in self.running)
        )
        self.step_index += 1
        return finished

    def _admit(self) -> list[Result]:
        if self.mode == "static" and self.running:
            return []  # static batching: nobody joins until the batch has drained
        finished = []
        while self.waiting and len(self.running) < self.max_batch:
            entry = self.waiting[0]
            context = entry.request.prompt + entry.result.tokens  # a preempted request resumes here
            if self.cache.blocks.blocks_for(len(context)) > self.cache.blocks.n_free:
                break  # first come, first served: wait for blocks rather than let others overtake
            self.waiting.popleft()
            seq_id = entry.request.request_id
            self.cache.add_sequence(seq_id)
            positions, mask = self.cache.begin([seq_id], len(context))
            tokens = torch.tensor([context], device=self.device)
            logits = self.model(tokens, self.cache, positions=positions, mask=mask, last_only=True)
            entry.admitted_step = self.step_index
            self.running.append(entry)
            if self._append(entry, int(logits[0, -1].argmax())):
                finished.append(self._retire(entry))
        return finished

    def _decode(self) -> list[Result]:
        if not self.running:
            return []
        while True:
            try:
                positions, mask = self.cache.begin([r.request.request_id for r in self.running], 1)
                break
            except OutOfBlocks:
                self._preempt_newest()
        self.batch_sizes.append(len(self.running))
        last = torch.tensor([[r.result.tokens[-1]] for r in self.running], device=self.device)
        logits = self.model(last, self.cache, positions=positions, mask=mask)
        finished = []
        for entry, token in zip(list(self.running), logits[:, -1].argmax(-1).tolist()):
            if self._append(entry, token):
                finished.append(self._retire(entry))
        return finished

    def _append(self, entry: _Running, token: int) -> bool:
        """Record a generated token; True if the request is now finished."""
        result = entry.result
        result.tokens.append(token)
        if result.first_token_step is None:
            result.first_token_step = self.step_index
        return (
            len(result.tokens) >= entry.request.max_new_tokens or token in entry.request.stop_tokens
        )

    def _retire(self, entry: _Running) -> Result:
        self.running.remove(entry)
        self.cache.free_sequence(entry.request.request_id)
        entry.result.finish_step = self.step_index
        return entry.result

    def _preempt_newest(self) -> None:
        if len(self.running) == 1:  # cannot happen: submit() guarantees one request fits alone
            raise RuntimeError("a lone request ran out of KV blocks")
        victim = max(self.running, key=lambda r: r.admitted_step)
        self.running.remove(victim)
        self.cache.free_sequence(victim.request.request_id)
        victim.result.preemptions += 1
        self.waiting.appendleft(victim)

    # ---- a whole stream ----------------------------------------------------------------------------

    def run(self, requests) -> list[Result]:
        """Feed `requests` as their arrival_step comes and step until all are done. Requests that
        can never fit come back with `error` set; every other request comes back with its tokens."""
        pending = deque(sorted(requests, key=lambda r: r.arrival_step))
        results = {}
        while pending or not self.idle:
            while pending and pending[0].arrival_step <= self.step_index:
                request = pending.popleft()
                try:
                    results[request.request_id] = self.submit(request)
                except ValueError as error:
                    results[request.request_id] = Result(
                        request.request_id, error=str(error), arrival_step=request.arrival_step
                    )
            self.step()
        return [results[r.request_id] for r in requests]
