"""`GET /metrics`: what an operator watches on a running server, in Prometheus' text format.

The names and concepts are vLLM's (with memwall's prefix), so a dashboard made for one reads the
other: requests running and waiting, KV-cache usage (a fraction of the paged cache's blocks),
prompt and generation tokens, time to first token (TTFT), time per output token (TPOT, every gap
between two tokens of a request) and end-to-end latency histograms, finished requests by reason
(stop, length, abort: the client left, shutdown: cut by a graceful shutdown, error), preemptions.

Histograms are cumulative: bucket `le="x"` counts the observations <= x, `+Inf` counts them all,
`_sum` and `_count` give the mean. Prometheus computes quantiles from the buckets, so a quantile is
only as fine as the buckets around it. The engine thread observes; HTTP threads render.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter

PREFIX = "memwall:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Bucket edges in seconds: TTFT spans one step to a long queue, a token gap one step to a stall.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)  # fmt: skip
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0,
               240.0, 480.0)  # fmt: skip


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class Histogram:
    def __init__(self, name: str, help_text: str, buckets):
        self.name, self.help_text, self.edges = PREFIX + name, help_text, tuple(buckets)
        self.counts = [0] * (len(self.edges) + 1)  # per bucket (not cumulative); the last: +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.edges, value)] += 1
        self.total += value

    def lines(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        running = 0
        for edge, count in zip((*self.edges, "+Inf"), self.counts):
            running += count
            lines.append(f'{self.name}_bucket{{le="{edge}"}} {running}')
        lines += [f"{self.name}_sum {_number(self.total)}", f"{self.name}_count {running}"]
        return lines


class ServingMetrics:
    """Counters and histograms of one server; thread-safe (the engine thread writes them)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = Counter()  # finish reason -> requests
        self.ttft = Histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.tpot = Histogram(
            "time_per_output_token_seconds", "Gap between two tokens of a request.", TPOT_BUCKETS
        )
        self.e2e = Histogram(
            "e2e_request_latency_seconds", "Arrival to last token, per request.", E2E_BUCKETS
        )

    def admitted(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def token(self, since_previous_s: float, first: bool) -> None:
        """One generated token, `since_previous_s` after the request's previous token (or its
        arrival, for the first)."""
        with self._lock:
            self.generation_tokens += 1
            (self.ttft if first else self.tpot).observe(since_previous_s)

    def ended(self, reason: str, latency_s: float | None) -> None:
        with self._lock:
            self.finished[reason] += 1
            if latency_s is not None:
                self.e2e.observe(latency_s)

    def render(self, stats: dict, draining: bool = False) -> str:
        """The exposition text; `stats` is EngineLoop.stats() (the gauges)."""
        total = stats["total_blocks"]
        usage = (total - stats["free_blocks"]) / total if total else 0.0
        gauges = [
            ("num_requests_running", "Requests in the running batch.", stats["running"]),
            (
                "num_requests_waiting",
                "Requests waiting for a place or KV blocks.",
                stats["waiting"],
            ),
            ("kv_cache_usage_perc", "Fraction of the paged KV cache's blocks in use.", usage),
            ("server_draining", "1 while a graceful shutdown lets requests finish.", int(draining)),
        ]
        counters = [
            ("prompt_tokens_total", "Prompt tokens admitted.", self.prompt_tokens),
            ("generation_tokens_total", "Tokens generated.", self.generation_tokens),
            (
                "num_preemptions_total",
                "Requests preempted to free KV blocks.",
                stats["preemptions"],
            ),
            ("engine_steps_total", "Batched forward steps.", stats["steps"]),
        ]
        lines = []
        with self._lock:
            for kind, rows in (("gauge", gauges), ("counter", counters)):
                for name, help_text, value in rows:
                    lines += [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
                    lines.append(f"{PREFIX}{name} {_number(value)}")
            name = f"{PREFIX}request_success_total"
            lines += [f"# HELP {name} Finished requests by reason.", f"# TYPE {name} counter"]
            for reason in sorted(self.finished):
                lines.append(f'{name}{{finished_reason="{reason}"}} {self.finished[reason]}')
            for histogram in (self.ttft, self.tpot, self.e2e):
                lines += histogram.lines()
        return "\n".join(lines) + "\n"
