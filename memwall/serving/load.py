"""Measure a live OpenAI-compatible endpoint under load: TTFT and TPOT at a given concurrency.

`concurrency` client threads each send streaming requests back to back until `requests` have been
sent in total or `duration_s` has passed (both bounds always apply, so a run always ends). For
each request: TTFT = time to the first streamed token; TPOT = (time of last token - time of first)
/ (tokens - 1). Results are medians and 90th percentiles over requests, the book's method.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass
class RequestResult:
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0
    tokens: int = 0
    error: str | None = None


def one_request(
    url: str, prompt: str, max_tokens: int, model: str | None, timeout_s: float
) -> RequestResult:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0.0}
    if model:
        body["model"] = model
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    result, token_times = RequestResult(), []
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                choices = json.loads(data).get("choices") or []
                if choices and (
                    choices[0].get("text") or choices[0].get("delta", {}).get("content")
                ):
                    token_times.append(time.perf_counter())
    except (urllib.error.URLError, OSError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.latency_s = time.perf_counter() - start
    result.tokens = len(token_times)
    if token_times:
        result.ttft_s = token_times[0] - start
    if len(token_times) > 1:
        result.tpot_s = (token_times[-1] - token_times[0]) / (len(token_times) - 1)
    return result


def run_load(
    url: str,
    concurrency: int = 1,
    requests: int = 8,
    duration_s: float = 60.0,
    max_tokens: int = 32,
    prompt: str = "Explain why decoding a language model is limited by memory bandwidth.",
    model: str | None = None,
    timeout_s: float = 60.0,
) -> dict:
    """Drive `url` with `concurrency` streaming clients; return a summary dict (see module docstring)."""
    if concurrency < 1 or requests < 1 or duration_s <= 0 or max_tokens < 1:
        raise ValueError("concurrency, requests, duration and max_tokens must all be positive")
    results: list[RequestResult] = []
    lock, deadline = threading.Lock(), time.perf_counter() + duration_s
    sent = [0]

    def client():
        while time.perf_counter() < deadline:
            with lock:
                if sent[0] >= requests:
                    return
                sent[0] += 1
            outcome = one_request(
                url,
                prompt,
                max_tokens,
                model,
                min(timeout_s, max(deadline - time.perf_counter(), 1)),
            )
            with lock:
                results.append(outcome)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration_s + timeout_s)
    wall = time.perf_counter() - start
    return summarize(results, wall, url=url, concurrency=concurrency, max_tokens=max_tokens)


def summarize(results: list[RequestResult], wall_s: float, **context) -> dict:
    ok = [r for r in results if r.error is None and r.tokens > 0]

    def stats(values):
        values = sorted(v for v in values if v is not None)
        if not values:
            return {"median_ms": None, "p90_ms": None}
        p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
        return {"median_ms": statistics.median(values) * 1e3, "p90_ms": p90 * 1e3}

    return {
        **context,
        "requests": len(results),
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s,
        "ttft": stats(r.ttft_s for r in ok),
        "tpot": stats(r.tpot_s for r in ok),
        "latency": stats(r.latency_s for r in ok),
        "output_tokens": sum(r.tokens for r in ok),
        "throughput_tok_per_s": sum(r.tokens for r in ok) / wall_s if wall_s > 0 else 0.0,
    }
