"""Pretend machines with a fake clock, for exercises where you write the measuring code.

A measured exercise hands your function a *bench*: an object with a ``clock()`` (a stand-in for
``time.perf_counter()``, in seconds) and one or more pieces of work to time with it. During a
check the bench is fake: running the work only moves the fake clock on, by a time the pretend
machine decides, including what makes real timings hard (noise, rare slow outliers, warm-up,
a machine that drifts or jumps between two speeds, a cache that keeps the last buffer read).
A sound measuring method recovers the machine's true numbers on every such bench; a naive one
does not. In the exercise's widget the same function gets a real bench (``memwall.widgets.measured``)
with ``time.perf_counter`` and real work.

A bench is built from plain data, ``build(kind, spec)``, so the grader can send the spec and
the student's kernel builds the same bench. This module holds no answers: the truth each check
compares with is computed from the spec by the grader.

Kinds (methods besides ``clock()``):

- ``"ab"``: ``run_a()``, ``run_b()``: two pieces of work to compare.
- ``"steps"``: ``step()``: the next decode step of a run (the first few are slow).
- ``"cache_sweep"``: ``read(n_bytes)``: read a buffer of that size once. The cache keeps the
  buffer read last, if it fits: reading the same size again comes from the cache; the first read
  of a size (or a read after another size) comes from memory.
- ``"kv_steps"``: ``step(context)``: one decode step at that context length.
- ``"batch_steps"``: ``step(batch)``: one decode step for that many users.
- ``"formats"``: ``matvec(name)``: one matrix-vector product with the weights in that format.
- ``"verify"``: ``decode()``: one plain decode step of the target; ``verify(k)``: one verify
  pass over k guesses plus the next token (k + 1 positions).

The simplest fake clock, ``FakeClockWorkload`` (``build_spec("fake_clock_workload",
step_times_s=[...])``, the example of ``memwall.exercise_driver.builders``), runs a fixed list
of step times: ``clock()`` reads the fake time and ``run_step()`` advances it by the next one.
"""

import math
import random

from memwall.exercise_driver.builders import builder
from memwall.validate import count


class FakeMachine:
    """The fake clock and the rules that stretch each piece of work's true time.

    ``noise``: spread of the multiplicative jitter (lognormal sigma). ``outlier_rate``: chance a
    call is hit by an interruption that makes it ``outlier_factor`` times slower.
    ``warmup_calls``: the first calls of each kind of work are about ``warmup_factor`` times
    slower (0.6-1.4 times that, drawn once per kind of work).
    ``drift_per_s``: the machine slows by this fraction per second of fake time.
    ``jumps``: ``[start_s, end_s, factor]`` spans when the machine runs ``factor`` times slower.
    """

    def __init__(self, seed=0, noise=0.0, outlier_rate=0.0, outlier_factor=1.0,
                 warmup_calls=0, warmup_factor=1.0, drift_per_s=0.0, jumps=()):  # fmt: skip
        self._rng = random.Random(seed)
        self._noise = float(noise)
        self._outlier_rate = float(outlier_rate)
        self._outlier_factor = float(outlier_factor)
        self._warmup_calls = int(warmup_calls)
        self._warmup_factor = float(warmup_factor)
        self._drift_per_s = float(drift_per_s)
        self._jumps = [tuple(float(v) for v in jump) for jump in jumps]
        self._now_s = 0.0
        self._calls_by_work = {}
        self._warmup_by_work = {}
        self.calls = 0

    def clock(self) -> float:
        """The fake time in seconds."""
        return self._now_s

    def spend(self, seconds, work="work"):
        """Run work whose true time is ``seconds``: the clock moves on by what it really took."""
        done = self._calls_by_work.get(work, 0)
        self._calls_by_work[work] = done + 1
        self.calls += 1
        factor = 1.0 + self._drift_per_s * self._now_s
        for start, end, slower in self._jumps:
            if start <= self._now_s < end:
                factor *= slower
        if done < self._warmup_calls:
            if work not in self._warmup_by_work:  # each kind of work warms up its own way
                self._warmup_by_work[work] = self._warmup_factor * self._rng.uniform(0.6, 1.4)
            factor *= self._warmup_by_work[work]
        if self._noise:
            factor *= math.exp(self._rng.gauss(0.0, self._noise))
        if self._outlier_rate and self._rng.random() < self._outlier_rate:
            factor *= self._outlier_factor
        self._now_s += float(seconds) * factor


class Bench:
    """What an exercise function receives: ``clock()`` plus the work (see the subclasses).

    Under ``memwall grade`` the bench stays in the grader's process (``served_remotely``): the
    student's function gets a stand-in whose calls run here, so the true timings stay here too."""

    served_remotely = True

    def __init__(self, machine: FakeMachine):
        self._machine = machine

    def clock(self) -> float:
        return self._machine.clock()

    def __repr__(self):
        return f"<{type(self).__name__} on a fake clock>"


class ABBench(Bench):
    def __init__(self, machine, a_s, b_s):
        super().__init__(machine)
        self._a_s, self._b_s = float(a_s), float(b_s)

    def run_a(self):
        self._machine.spend(self._a_s, "a")

    def run_b(self):
        self._machine.spend(self._b_s, "b")


class CacheSweepBench(Bench):
    def __init__(self, machine, cache_bytes, cache_gb_s, memory_gb_s):
        super().__init__(machine)
        self._cache_bytes = int(cache_bytes)
        self._cache_gb_s, self._memory_gb_s = float(cache_gb_s), float(memory_gb_s)
        self._in_cache = None  # the size of the buffer the cache holds

    def read(self, n_bytes):
        n_bytes = count("n_bytes", n_bytes)
        cached = n_bytes == self._in_cache
        gb_s = self._cache_gb_s if cached else self._memory_gb_s
        self._machine.spend(n_bytes / (gb_s * 1e9), "read")
        self._in_cache = n_bytes if n_bytes <= self._cache_bytes else None


class KVStepsBench(Bench):
    def __init__(self, machine, weights_s, s_per_token):
        super().__init__(machine)
        self._weights_s, self._s_per_token = float(weights_s), float(s_per_token)

    def step(self, context):
        context = count("context", context)
        self._machine.spend(self._weights_s + context * self._s_per_token, "step")


class BatchStepsBench(Bench):
    def __init__(self, machine, weights_s, kv_s_per_user, compute_s_per_user):
        super().__init__(machine)
        self._weights_s = float(weights_s)
        self._kv_s_per_user = float(kv_s_per_user)
        self._compute_s_per_user = float(compute_s_per_user)

    def step(self, batch):
        batch = count("batch", batch)
        memory_s = self._weights_s + batch * self._kv_s_per_user
        self._machine.spend(max(memory_s, batch * self._compute_s_per_user), ("step", batch))


class FormatsBench(Bench):
    def __init__(self, machine, seconds_by_format):
        super().__init__(machine)
        self._seconds = {str(name): float(s) for name, s in seconds_by_format.items()}

    def matvec(self, name):
        if name not in self._seconds:
            raise ValueError(f"unknown format {name!r}; choose from {sorted(self._seconds)}")
        self._machine.spend(self._seconds[name], ("matvec", name))


class VerifyBench(Bench):
    def __init__(self, machine, decode_s, extra_s_per_guess):
        super().__init__(machine)
        self._decode_s, self._extra_s_per_guess = float(decode_s), float(extra_s_per_guess)

    def decode(self):
        self._machine.spend(self._decode_s, "decode")

    def verify(self, k):
        k = count("k", k)
        self._machine.spend(self._decode_s + k * self._extra_s_per_guess, ("verify", k))


class StepsBench(Bench):
    def __init__(self, machine, step_s):
        super().__init__(machine)
        self._step_s = float(step_s)

    def step(self):
        self._machine.spend(self._step_s, "step")


KINDS = {
    "ab": ABBench,
    "steps": StepsBench,
    "cache_sweep": CacheSweepBench,
    "kv_steps": KVStepsBench,
    "batch_steps": BatchStepsBench,
    "formats": FormatsBench,
    "verify": VerifyBench,
}


def build(kind: str, spec: dict) -> Bench:
    """The bench of ``kind`` described by ``spec``: ``{"machine": {...}, **work parameters}``."""
    if kind not in KINDS:
        raise ValueError(f"unknown bench kind {kind!r}; choose from {sorted(KINDS)}")
    if not isinstance(spec, dict):
        raise ValueError(f"a bench spec is a dict, got {type(spec).__name__}")
    spec = dict(spec)
    machine = FakeMachine(**spec.pop("machine", {}))
    return KINDS[kind](machine, **spec)


def bench_spec(kind: str, **spec) -> dict:
    """Plain data that ``build_case`` turns into a bench: ``{"bench": kind, "spec": spec}``."""
    return {"bench": kind, "spec": spec}


def build_case(case: dict) -> dict:
    """A case's keyword arguments with each bench spec built into a bench."""
    return {
        key: build(value["bench"], value["spec"]) if is_bench_spec(value) else value
        for key, value in case.items()
    }


def is_bench_spec(value) -> bool:
    """Whether a case's value is a bench's plain-data spec (built into a bench by `build_case`)."""
    return isinstance(value, dict) and set(value) == {"bench", "spec"}


# ---- the simplest fake clock: a fixed list of step times ----------------------------------------


class FakeClockWorkload:
    served_remotely = True  # under `memwall grade` it stays in the grader (see values.py)

    def __init__(self, step_times_s, start_s=0.0):
        self._step_times_s = [float(t) for t in step_times_s]
        self._now_s = float(start_s)
        self._next = 0

    @property
    def n_steps(self) -> int:
        return len(self._step_times_s)

    def clock(self) -> float:
        """The fake time in seconds (a stand-in for time.perf_counter())."""
        return self._now_s

    def run_step(self):
        """Run the next step: the clock moves on by its time."""
        if self._next >= len(self._step_times_s):
            raise RuntimeError(f"the workload has only {len(self._step_times_s)} steps")
        self._now_s += self._step_times_s[self._next]
        self._next += 1

    def __repr__(self):
        return f"FakeClockWorkload({self.n_steps} steps)"


@builder("fake_clock_workload")
def build_fake_clock_workload(spec):
    step_times = spec.get("step_times_s")
    if not isinstance(step_times, list) or not all(
        isinstance(t, (int, float)) and t >= 0 for t in step_times
    ):
        raise ValueError("fake_clock_workload needs step_times_s: a list of times >= 0")
    return FakeClockWorkload(step_times, spec.get("start_s", 0.0))
