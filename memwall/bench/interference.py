"""Prefill/decode interference, measured on memwall's running server, with and without chunking.

A few streams are decoding steadily when a long prompt arrives. Without chunked prefill, the step
that admits it runs the whole prompt through the model, and every stream waits that long for its
next token: one huge gap in their time per output token (TPOT). With `prefill_chunk=N`, the prompt
goes in N tokens per step, between decode steps, so the streams keep getting tokens and the gap
shrinks to about one chunk's prefill, while the long request's own time to first token (TTFT)
grows a little (Agrawal et al. 2024, "Sarathi-Serve").

`measure_interference(engine, tokenizer)` starts a server per setting on 127.0.0.1, runs the
streams and the long prompt, and reports per setting: the streams' median TPOT before the long
prompt, their median and largest gap while it was being prefilled, how many tokens they got in
that window (as the clients saw them), the long request's TTFT, and the engine's own count of the
steps that decoded the streams while the long prompt was being prefilled (0 for a whole prefill:
the exact, load-independent view of the same thing). Settings alternate across repeats; values
are medians.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import threading
import time

from memwall.serving.server import start_server


class _Stream(threading.Thread):
    """One streaming completion whose token arrival times are recorded until `close()`."""

    def __init__(self, port, body):
        super().__init__(daemon=True)
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.body, self.times, self.error = json.dumps(body), [], None

    def run(self):
        try:
            self.connection.request("POST", "/v1/completions", self.body)
            response = self.connection.getresponse()
            if response.status != 200:
                self.error = f"HTTP {response.status}: {response.read()[:300].decode()}"
            for line in response:
                if line.startswith(b"data: {") and b'"choices": [{' in line:
                    self.times.append(time.perf_counter())
        except (OSError, ValueError, AttributeError):  # closed under us: that is how it ends
            pass

    def close(self):
        self.connection.close()


def _wait(condition, timeout_s, streams):
    deadline = time.perf_counter() + timeout_s
    while not condition():
        errors = [s.error for s in streams if s.error]
        if errors:
            raise RuntimeError(f"the server refused a request: {errors[0]}")
        if time.perf_counter() > deadline:
            raise TimeoutError("the server did not answer in time")
        time.sleep(0.005)


def one_run(engine, tokenizer, prefill_chunk, prompt_ids, streams, warmup_tokens, timeout_s):
    # Streams long enough to outlast the long prefill (one token per chunk, and some after),
    # and a cache just big enough for everyone, since it is allocated up front.
    stream_tokens = warmup_tokens + len(prompt_ids) // min(prefill_chunk or 64, 64) + 64
    stream_tokens = min(stream_tokens, engine.max_positions - 8)
    kv_tokens = len(prompt_ids) + streams * (stream_tokens + 8) + 64
    server = start_server(
        engine,
        tokenizer,
        "model",
        kv_tokens=kv_tokens,
        max_batch=streams + 1,
        prefill_chunk=prefill_chunk,
    )
    port = server.server_port
    body = {
        "prompt": prompt_ids[:8],
        "max_tokens": stream_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    clients = [_Stream(port, body | {"stream": True}) for _ in range(streams)]
    try:
        for client in clients:
            client.start()
        _wait(lambda: all(len(c.times) >= warmup_tokens for c in clients), timeout_s, clients)
        long_body = {"prompt": prompt_ids, "max_tokens": 1, "temperature": 0, "stream": True}
        arrival = time.perf_counter()
        long = _Stream(port, long_body)
        long.start()
        _wait(lambda: long.times, timeout_s, [*clients, long])
        first_token = long.times[0]
        answered = server.loop.finished[-1]  # the long request: nothing else has finished
        steps = answered.first_token_step - answered.arrival_step
        _wait(lambda: all(c.times[-1] > first_token for c in clients), timeout_s, clients)
    finally:
        for client in clients:
            client.close()
        server.shutdown()
    return {
        "prefill_chunk": prefill_chunk,
        **_summarize(clients, arrival, first_token),
        "engine_steps_during_prefill": steps,
    }


def _summarize(clients, arrival, first_token) -> dict:
    before, during, tokens_during = [], [], 0
    for client in clients:
        for previous, this in zip(client.times, client.times[1:]):
            if this <= arrival:
                before.append(this - previous)
            elif previous < first_token:  # a gap that overlaps the long prompt's prefill
                during.append(this - previous)
        tokens_during += sum(arrival < t <= first_token for t in client.times)
    return {
        "tpot_before_ms": statistics.median(before) * 1e3,
        "tpot_during_ms": statistics.median(during) * 1e3,
        "max_gap_during_ms": max(during) * 1e3,
        "stream_tokens_during_prefill": tokens_during / len(clients),
        "long_ttft_ms": (first_token - arrival) * 1e3,
    }


def measure_interference(
    engine,
    tokenizer,
    prompt_tokens: int = 2000,
    streams: int = 4,
    prefill_chunks=(None, 256),
    repeats: int = 1,
    warmup_tokens: int = 8,
    seed: int = 0,
    timeout_s: float = 600.0,
) -> dict:
    """TPOT of `streams` ongoing streams while a `prompt_tokens` prompt arrives, for each
    prefill_chunk setting (None: whole prompts). Returns {"runs": [one dict per setting]}."""
    if prompt_tokens < 1 or streams < 1 or repeats < 1 or warmup_tokens < 2:
        raise ValueError("prompt_tokens, streams and repeats must be >= 1, warmup_tokens >= 2")
    if prompt_tokens + 1 > engine.max_positions:
        raise ValueError(f"prompt_tokens must be below the model's {engine.max_positions}")
    vocab = engine.embed.num_embeddings
    rng = random.Random(seed)
    prompt_ids = [rng.randrange(vocab) for _ in range(prompt_tokens)]  # only the length matters
    samples = {chunk: [] for chunk in prefill_chunks}
    for repeat in range(repeats):
        order = list(prefill_chunks) if repeat % 2 == 0 else list(prefill_chunks)[::-1]
        for chunk in order:
            samples[chunk].append(
                one_run(engine, tokenizer, chunk, prompt_ids, streams, warmup_tokens, timeout_s)
            )
    runs = []
    for chunk, results in samples.items():
        merged = {
            key: statistics.median(r[key] for r in results)
            for key in results[0]
            if key != "prefill_chunk"
        }
        runs.append({"prefill_chunk": chunk, **merged})
    return {"prompt_tokens": prompt_tokens, "streams": streams, "repeats": repeats, "runs": runs}
