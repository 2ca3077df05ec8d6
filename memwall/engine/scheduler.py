"""Continuous batching (Yu et al. 2022, "Orca") on the paged KV cache (Kwon et al. 2023).

Static batching takes B requests, decodes until the *last* of them finishes, and only then takes
the next B. Finished requests hold their slots idle and new arrivals queue behind the slowest one.
Continuous (iteration-level) batching schedules every step: a request that finishes leaves at once
and a waiting one joins at the next step, so the batch stays full without ever draining.

One `step()` here does, in order:
1. one batched decode step for every running request whose prompt is in the cache (one token
   each); requests that hit a stop token or their max_new_tokens retire at once and their blocks
   go back to the free list;
2. admit waiting requests (first come, first served) while the batch has room and the cache has
   blocks for their whole prompt, which are reserved on admission;
3. prefill: without `prefill_chunk`, every newly admitted prompt is prefilled whole, so a long
   prompt stalls everyone's next token for its whole prefill. With `prefill_chunk=N`, at most N
   prompt tokens are prefilled per step (chunked prefill, Agrawal et al. 2024, "Sarathi"), so the
   stall per step is bounded and a long prompt takes several steps. Sarathi fuses the chunk into
   the decode batch to share one weight read; here the chunk is its own forward pass, which is
   simpler and bounds the stall just the same. A request yields its first token when its last
   chunk is done, and decodes with the others from the next step on.
If a decode step needs a block and none is free, the most recently admitted request is preempted:
its blocks are freed and it goes back to the front of the queue with the tokens it has generated,
to be prefilled again later (vLLM's "recompute" preemption). A request is never dropped: it
finishes, is aborted by its owner (`abort`), or `submit` refuses it up front because its prompt
plus max_new_tokens can never fit. Greedy requests get exactly the tokens of decoding them alone;
sampled ones draw from their own seeded generator, so their batch-mates do not change their draws.

This is the one decode loop behind the `memwall serve` server (`memwall.serving.engine_loop`).
"""

from __future__ import annotations

import time
from collections import deque

import torch

from memwall.engine.block_manager import MemoryUse, OutOfBlocks
from memwall.engine.paged_cache import PagedKVCache
from memwall.engine.sampling import make_generator, sample
from memwall.engine.sequence import FINISH_REASONS, Request, Result, Running

__all__ = ["FINISH_REASONS", "MODES", "Request", "Result", "Scheduler"]

MODES = ("continuous", "static")


class Scheduler:
    def __init__(
        self,
        model,
        n_blocks: int,
        block_size: int = 16,
        max_batch: int = 8,
        mode: str = "continuous",
        prefill_chunk: int | None = None,
        on_token=None,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None for whole), got {prefill_chunk}")
        self.model, self.mode, self.max_batch = model, mode, max_batch
        self.prefill_chunk = prefill_chunk
        # on_token(result, token, finish_reason or None) is called for every token as it is made.
        self.on_token = on_token
        # A speed path may lay the blocks out its own way (the GPU's compiled step does).
        if hasattr(model, "new_paged_cache"):
            self.cache = model.new_paged_cache(n_blocks, block_size)
        else:
            self.cache = PagedKVCache.for_model(model, n_blocks, block_size)
        self.device = next(model.parameters()).device
        self.waiting: deque[Running] = deque()
        self.running: list[Running] = []
        self.step_index = 0
        self.preemptions = 0  # in all
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
        limit = self.max_tokens_per_request
        if prompt + new > limit:
            raise ValueError(
                f"request {request.request_id!r} can never fit: prompt ({prompt}) + max_new_tokens "
                f"({new}) = {prompt + new} tokens, but the KV cache holds at most {limit} "
                f"({self.cache.blocks.n_blocks} blocks of {self.cache.blocks.block_size}, model "
                f"context {self.model.max_positions}). Shorten it or give the cache more blocks."
            )
        result = Result(request.request_id, arrival_step=request.arrival_step)
        generator = make_generator(request.sampling, self.device)
        self.waiting.append(Running(request, result, admitted_step=-1, generator=generator))
        return result

    @property
    def max_tokens_per_request(self) -> int:
        """Prompt + new tokens of the longest request that could ever run alone."""
        return min(self.cache.blocks.capacity_tokens, self.model.max_positions)

    def abort(self, request_id) -> Result | None:
        """Drop a waiting or running request and free its blocks; None if it is not here."""
        for entry in self.waiting:
            if entry.request.request_id == request_id:
                self.waiting.remove(entry)
                entry.result.finish_reason, entry.result.finish_step = "abort", self.step_index
                return entry.result
        for entry in self.running:
            if entry.request.request_id == request_id:
                return self._retire(entry, "abort")
        return None

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # ---- one step ------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Result]:
        """Decode, admit, prefill and retire once; return the requests that finished."""
        start = time.perf_counter()
        # The running requests decode first: a newcomer gets its first token from its prefill.
        finished = self._decode()
        self._admit()
        finished += self._prefill()
        if self.device.type == "cuda":  # a prefill that gave no token has not been waited for
            torch.cuda.synchronize(self.device)
        self.step_times_s.append(time.perf_counter() - start)
        self.memory.append(self.cache.blocks.memory_use())
        self.reserved_if_contiguous.append(
            sum(len(r.request.prompt) + r.request.max_new_tokens for r in self.running)
        )
        self.step_index += 1
        return finished

    def _admit(self) -> None:
        if self.mode == "static" and self.running:
            return  # static batching: nobody joins until the batch has drained
        blocks = self.cache.blocks
        while self.waiting and len(self.running) < self.max_batch:
            entry = self.waiting[0]
            context = entry.request.prompt + entry.result.tokens  # a preempted request resumes here
            if blocks.blocks_for(len(context)) > blocks.n_free:
                break  # first come, first served: wait for blocks rather than let others overtake
            self.waiting.popleft()
            seq_id = entry.request.request_id
            self.cache.add_sequence(seq_id)
            blocks.reserve([seq_id], len(context))  # the whole prompt's blocks, held from now on
            entry.context, entry.prefilled = context, 0
            entry.admitted_step = self.step_index
            self.running.append(entry)

    def _prefill(self) -> list[Result]:
        """Prefill this step's share of the prompts: all of them, or `prefill_chunk` tokens.
        Pieces of equal length go through the model together, so a burst of same-length prompts
        (a benchmark's) costs one weight read instead of one each."""
        budget, pieces = self.prefill_chunk or float("inf"), {}
        for entry in [r for r in self.running if r.prefilling]:
            if budget <= 0:
                break
            count = int(min(budget, len(entry.context) - entry.prefilled))
            pieces.setdefault(count, []).append(entry)
            budget -= count
        finished = []
        for count, entries in pieces.items():
            ids = [e.request.request_id for e in entries]
            positions, mask = self.cache.begin(ids, count)
            rows = [e.context[e.prefilled : e.prefilled + count] for e in entries]
            tokens = torch.tensor(rows, device=self.device)
            logits = self.model(tokens, self.cache, positions=positions, mask=mask, last_only=True)
            for entry in entries:
                entry.prefilled += count
            done = [e for e in entries if not e.prefilling]  # their last piece gives a token
            if done:
                last = logits[[entries.index(e) for e in done], -1]
                for entry, token in zip(done, self._choose(done, last)):
                    result = self._record(entry, token)
                    finished += [result] if result else []
        return finished

    def _decode(self) -> list[Result]:
        while True:
            batch = [r for r in self.running if not r.prefilling]
            if not batch:
                return []
            try:
                positions, mask = self.cache.begin([r.request.request_id for r in batch], 1)
                break
            except OutOfBlocks:
                self._preempt_newest()
        self.batch_sizes.append(len(batch))
        last = torch.tensor([[r.result.tokens[-1]] for r in batch], device=self.device)
        logits = self.model(last, self.cache, positions=positions, mask=mask)
        finished = []
        for entry, token in zip(batch, self._choose(batch, logits[:, -1])):
            done = self._record(entry, token)
            finished += [done] if done else []
        return finished

    def _choose(self, entries: list[Running], logits: torch.Tensor) -> list[int]:
        """The next token of each entry from its logits row [batch, vocab]: one argmax for the
        greedy rows, each sampled row from its own generator. `.tolist()` waits for the device."""
        tokens = logits.argmax(-1)
        for row, entry in enumerate(entries):
            if not entry.request.sampling.greedy:
                tokens[row] = sample(
                    logits[row : row + 1], entry.request.sampling, entry.generator
                )[0]
        return tokens.tolist()

    def _record(self, entry: Running, token: int) -> Result | None:
        """Append a generated token; retire the request if that finished it (returned)."""
        result = entry.result
        result.tokens.append(token)
        if result.first_token_step is None:
            result.first_token_step = self.step_index
        reason = None
        if token in entry.request.stop_tokens:
            reason = "stop"
        elif len(result.tokens) >= entry.request.max_new_tokens:
            reason = "length"
        if reason:
            self._retire(entry, reason)
        if self.on_token is not None:
            self.on_token(result, token, reason)
        return result if reason else None

    def _retire(self, entry: Running, reason: str) -> Result:
        self.running.remove(entry)
        self.cache.free_sequence(entry.request.request_id)
        entry.result.finish_step, entry.result.finish_reason = self.step_index, reason
        return entry.result

    def _preempt_newest(self) -> None:
        if len(self.running) == 1:  # cannot happen: submit() guarantees one request fits alone
            raise RuntimeError("a lone request ran out of KV blocks")
        victim = max(self.running, key=lambda r: r.admitted_step)
        self.running.remove(victim)
        self.cache.free_sequence(victim.request.request_id)
        victim.result.preemptions += 1
        self.preemptions += 1
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
