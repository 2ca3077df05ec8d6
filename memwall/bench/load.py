"""Measure a live OpenAI-compatible endpoint under load: TTFT, TPOT and what each request returned.

Closed loop (the default): `concurrency` clients each send streaming requests back to back.
Open loop (`request_rate=R`): requests arrive as a Poisson process of rate R per second (seeded),
with at most `concurrency` in flight. Both stop after `requests` requests or `duration_s` seconds.
The clients run in a process of their own, so a server in the caller's process (a notebook, a test)
does not share an interpreter lock with the load that measures it.

For each request: TTFT = time to the first streamed text; TPOT = (last text - first text) /
(tokens - 1). The token count is the server's own `usage.completion_tokens` when it sends one
(`stream_options.include_usage`), else the number of chunks with text. A request is "ok" only if
the stream ended properly with finish_reason "stop" or "length" and, when the count is known
exactly or `ignore_eos` asked for fixed lengths, it produced what it claims: `max_tokens` tokens
for "length". Anything else is "cut short" (a server that interrupts running requests shows up
here), and a request with no answer is an error. Statistics are medians and 90th percentiles.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context

DEFAULT_PROMPT = "Explain why decoding a language model is limited by memory bandwidth."
ENDPOINTS = ("completions", "chat")


@dataclass
class RequestResult:
    start_s: float = 0.0  # since the run began
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float = 0.0
    tokens: int = 0
    counted_from: str = "chunks"  # or "usage"
    finish_reason: str | None = None
    outcome: str = "error"  # "ok", "cut short" or "error"
    error: str | None = None


def base_url(url: str) -> str:
    """'http://host:port', '.../' or '.../v1' -> 'http://host:port/v1'; ValueError if malformed."""
    example = "e.g. http://127.0.0.1:8000 or http://127.0.0.1:8000/v1"
    parts = urllib.parse.urlsplit(str(url).strip())
    try:
        valid = parts.scheme in ("http", "https") and parts.hostname and parts.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    if not valid or parts.query or parts.fragment or path.endswith("completions"):
        raise ValueError(f"--url must be a server's base URL ({example}), got {url!r}")
    return f"{parts.scheme}://{parts.netloc}{path}/v1"


def headers_for(api_key: str | None) -> dict:
    """The request headers: JSON, and the key as OpenAI-compatible servers take it, if any."""
    return {"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {api_key}"} if api_key else {}
    )


def served_model(base: str, timeout_s: float = 10.0, headers=None) -> str | None:
    """The first model the server lists at /v1/models (None if it lists none or cannot say)."""
    try:
        request = urllib.request.Request(base + "/models", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            data = json.loads(response.read()).get("data") or []
            return data[0].get("id") if data else None
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return None


def request_body(endpoint, prompt, max_tokens, model, ignore_eos) -> dict:
    body = {"max_tokens": max_tokens, "stream": True, "temperature": 0.0}
    body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if model:
        body["model"] = model
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def one_request(base, body, timeout_s, started_at, headers=None) -> RequestResult:
    path = "/chat/completions" if "messages" in body else "/completions"
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers=headers or headers_for(None)
    )
    result, token_times, usage, done = RequestResult(), [], None, False
    start = time.perf_counter()
    result.start_s = start - started_at
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        token_times.append(time.perf_counter())
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
    except urllib.error.HTTPError as error:
        result.error = f"HTTP {error.code}: {error.read()[:200].decode('utf-8', 'replace')}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.latency_s = time.perf_counter() - start
    result.tokens = len(token_times)
    if usage and isinstance(usage.get("completion_tokens"), int):
        result.tokens, result.counted_from = usage["completion_tokens"], "usage"
    if token_times:
        result.ttft_s = token_times[0] - start
    if len(token_times) > 1:
        result.tpot_s = (token_times[-1] - token_times[0]) / (result.tokens - 1)
    result.outcome = classify(result, done, body["max_tokens"], body.get("ignore_eos", False))
    return result


def classify(result: RequestResult, done: bool, max_tokens: int, ignore_eos: bool) -> str:
    if result.error and not result.tokens:
        return "error"
    if result.error or not done or result.finish_reason not in ("stop", "length"):
        return "cut short"
    exact = result.counted_from == "usage"
    if (ignore_eos or (exact and result.finish_reason == "length")) and result.tokens < max_tokens:
        return "cut short"
    return "ok"


def drive(
    base, body, concurrency, requests, duration_s, timeout_s, request_rate, seed, headers=None
) -> dict:
    """Run the load in this process (run_load calls it in a child process); return the summary."""
    results: list[RequestResult] = []
    lock, slots = threading.Lock(), threading.Semaphore(concurrency)
    start = time.perf_counter()
    deadline = start + duration_s

    def send():
        outcome = one_request(
            base, body, min(timeout_s, max(deadline - time.perf_counter(), 1)), start, headers
        )
        with lock:
            results.append(outcome)
        slots.release()

    threads, arrivals = [], random.Random(seed)
    next_arrival = start
    for _ in range(requests):
        if request_rate:  # open loop: Poisson arrivals, exponential gaps
            next_arrival += arrivals.expovariate(request_rate)
            time.sleep(max(0.0, next_arrival - time.perf_counter()))
        if time.perf_counter() >= deadline or not slots.acquire(
            timeout=max(0.0, deadline - time.perf_counter())
        ):
            break
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.perf_counter()) + timeout_s)
    wall = time.perf_counter() - start
    with lock:
        done = sorted(results, key=lambda r: r.start_s)
    return summarize(done, wall)


def run_load(
    url: str,
    concurrency: int = 1,
    requests: int = 8,
    duration_s: float = 60.0,
    max_tokens: int = 32,
    prompt: str = DEFAULT_PROMPT,
    model: str | None = None,
    timeout_s: float = 60.0,
    ignore_eos: bool = False,
    request_rate: float | None = None,
    endpoint: str = "completions",
    seed: int = 0,
    api_key: str | None = None,
) -> dict:
    """Drive `url` (see the module docstring) from a child process; return a summary dict.
    api_key: sent as `Authorization: Bearer KEY` (never part of the summary)."""
    if concurrency < 1 or requests < 1 or duration_s <= 0 or max_tokens < 1:
        raise ValueError("concurrency, requests, duration and max_tokens must all be positive")
    if request_rate is not None and request_rate <= 0:
        raise ValueError(f"request_rate must be > 0 requests/s, got {request_rate}")
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; choose from {', '.join(ENDPOINTS)}")
    base = base_url(url)
    headers = headers_for(api_key)
    model = model or served_model(base, min(timeout_s, 10.0), headers)
    body = request_body(endpoint, prompt, max_tokens, model, ignore_eos)
    args = (base, body, concurrency, requests, duration_s, timeout_s, request_rate, seed, headers)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        summary = pool.submit(drive, *args).result()
    context = {"url": base, "model": model, "endpoint": endpoint, "concurrency": concurrency}
    context |= {"max_tokens": max_tokens, "ignore_eos": ignore_eos, "request_rate": request_rate}
    return context | summary


def summarize(results: list[RequestResult], wall_s: float) -> dict:
    ok = [r for r in results if r.outcome == "ok"]

    def stats(values):
        values = sorted(v for v in values if v is not None)
        if not values:
            return {"median_ms": None, "p90_ms": None}
        p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
        return {"median_ms": statistics.median(values) * 1e3, "p90_ms": p90 * 1e3}

    tpot = (
        statistics.median([r.tpot_s for r in ok if r.tpot_s]) if any(r.tpot_s for r in ok) else None
    )
    output_tokens = sum(r.tokens for r in results)
    return {
        "requests": len(results),
        "succeeded": len(ok),
        "cut_short": sum(r.outcome == "cut short" for r in results),
        "failed": sum(r.outcome == "error" for r in results),
        "finish_reasons": dict(Counter(str(r.finish_reason) for r in results)),
        "tokens_per_request": [r.tokens for r in results],
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall_s,
        "ttft": stats(r.ttft_s for r in ok),
        "tpot": stats(r.tpot_s for r in ok),
        "latency": stats(r.latency_s for r in ok),
        "output_tokens": output_tokens,
        "throughput_tok_per_s": output_tokens / wall_s if wall_s > 0 else 0.0,
        "per_user_tok_per_s": 1 / tpot if tpot else None,
        "per_request": [asdict(r) for r in results],
    }
