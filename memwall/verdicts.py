"""Judging a measurement before a verdict reads it.

A timing taken on a shared machine can be disturbed: another process holds a core, a neighbour's
traffic halves the memory bandwidth for a second. A verdict that reads such a timing as if it
were the machine's turns noise into a claim ("2 threads are 0.03x as fast as one", "a 168x
speed-up"). So every check here looks for one sign that the run cannot be trusted, and returns a
short description of it, or None when it found nothing:

- `spread_problem`: repeated timings of the same work disagree (p90 / p10 above a bound);
- `stall_problem`: a bandwidth probe sits well below the run's median probe;
- `thread_problem`: more threads made the same work slower (a core was taken);
- `bound_problem` and its two named cases, `batch_problem` and `speculative_problem`: a ratio
  beyond its physical bound (a batch of B cannot beat B times batch 1; a speculative pass cannot
  beat its tokens over its cost);
- `roof_problem`: a speed above the roof of the memory level its data lives in;
- `wait_problem`: this process's threads waited for a CPU (another process held a core), or a
  speed path moved to fewer threads for that reason (`memwall.machine.cpu_wait`);
- `stand_in_problem`: the roof is the cache's bandwidth standing in for DRAM's (the memory budget
  could not clear a large cache), so a fraction of it cannot say how close the bytes came to
  memory's speed. This is no disturbance: the verdict line says no verdict is possible here.

`verdict(text, *problems)` prints the verdict only when every check came back None, and
otherwise one line "this run was disturbed: <what>; rerun on a quiet machine". Every verdict
also runs `wait_problem` over the time since the previous one, which covers the measurements it
reads: a claim about timings cannot slip through on a busy machine because a chapter forgot a
check. Code that reads its problems before the verdict adds `machine_problem()` to them. Pass
`timed=False` for a verdict that reads no timing.

Comparisons are two-sided: `compare(a, b)` calls two timings "about the same" only when neither
is more than `band` faster than the other, and says which one is faster otherwise.

A fraction of the roofline can mislead in three ways, and `fraction_of_roof` guards against
each: a roof measured low makes the fraction too high (above 1 is impossible, so it is a
problem, not a verdict); a working set that fits in a cache answers to the cache's roof, not
DRAM's (pass the roof `Measurement.roof_for(nbytes)` picks); a roof probed during a stall makes
every fraction look good (`stall_problem` on the probes).

Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from memwall.machine.cpu_wait import CpuWait

BAND = 0.10  # two results within 10% of each other, either way, are "about the same"
# p90 / p10 of repeated timings above this: the machine was busy. A quiet machine stays near
# 1.1; a brief neighbour moves the tail without moving a median, and is not a disturbance.
SPREAD_BOUND = 2.0
STALL_SHARE = 0.6  # a probe below 60% of the run's median probe was taken during a stall
THREAD_SLOWDOWN = 0.75  # more threads at under 0.75x the speed of one: a core was taken
MARGIN = 1.15  # a ratio more than 15% past its physical bound is a disturbed run
# Threads that spent more than this share of the CPU time they wanted waiting for a core: another
# process held one. A quiet machine stays near 1% (the kernel's own work).
WAIT_SHARE = 0.10
# ... and at least this long in all: a short span (a verdict right after another) can show a
# large share of a few scheduler ticks that moved no measurement.
WAIT_FLOOR_S = 0.1
COLUMN = 88  # printed lines wrap here, inside the book's output column (92 characters)


def _positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}.")


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default)."""
    ordered = sorted(float(x) for x in samples)  # a list, a tuple or a numpy array
    if not ordered:
        raise ValueError("percentile of no samples.")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be between 0 and 100, got {q!r}.")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(samples: Sequence[float]) -> float:
    """p90 / p10 of repeated timings: 1.0 for a machine that gave the same time every repeat."""
    low = percentile(samples, 10)
    if not low > 0:
        raise ValueError(f"timings must be positive, got {float(min(samples))!r}.")
    return percentile(samples, 90) / low


def spread_problem(
    samples: Sequence[float], bound: float = SPREAD_BOUND, what: str = "the timings"
) -> str | None:
    """Repeated timings of the same work whose p90 / p10 exceeds `bound`. Fewer than 3 samples
    cannot show a spread, and are not judged."""
    _positive("bound", bound)
    if len(samples) < 3:
        return None
    ratio = spread(samples)
    if ratio > bound:
        return f"{what}: p90/p10 {ratio:.1f}x > {bound:.1f}x"
    return None


def stall_problem(
    probe: float, probes: Sequence[float], share: float = STALL_SHARE, what: str = "a probe"
) -> str | None:
    """A bandwidth probe (bytes/s) below `share` of the median of the run's probes: whatever
    was measured next to it ran during a stall, and a roof taken then is too low."""
    _positive("probe", probe)
    if len(probes) == 0:
        return None
    middle = percentile(probes, 50)
    if probe < share * middle:
        return (
            f"{what} read {probe / 1e9:.1f} GB/s against the run's median "
            f"{middle / 1e9:.1f} GB/s (a stall)"
        )
    return None


def thread_problem(
    seconds_one: float, seconds_many: float, threads: int, floor: float = THREAD_SLOWDOWN
) -> str | None:
    """The same work on `threads` threads ran at under `floor` times the speed of one thread.
    On a quiet machine extra threads cost little; that much slower means they waited on a core
    that another process holds."""
    _positive("seconds_one", seconds_one)
    _positive("seconds_many", seconds_many)
    gain = seconds_one / seconds_many
    if threads > 1 and gain < floor:
        return f"{threads} threads ran {gain:.2f}x as fast as one (a busy core)"
    return None


def bound_problem(value: float, bound: float, what: str, margin: float = MARGIN) -> str | None:
    """A measured ratio above its physical `bound` by more than `margin`: not a result but a
    disturbed baseline (or a wrong roof)."""
    _positive("bound", bound)
    if value > bound * margin:
        return f"{what} is {value:.2f}x, above its bound of {bound:.2f}x"
    return None


def batch_problem(gain: float, batch: int, margin: float = MARGIN) -> str | None:
    """A batch of B cannot produce more than B times the tokens/s of batch 1: each of its steps
    does at least the work of one batch-1 step."""
    return bound_problem(gain, batch, f"batch {batch} over batch 1", margin)


def speculative_problem(
    speedup: float, tokens_per_pass: float, pass_cost: float, margin: float = MARGIN
) -> str | None:
    """Speculative decoding cannot beat tokens per pass over what a pass costs (k draft steps
    plus the verify pass, in plain decode steps)."""
    _positive("tokens_per_pass", tokens_per_pass)
    _positive("pass_cost", pass_cost)
    return bound_problem(speedup, tokens_per_pass / pass_cost, "the speculative speed-up", margin)


def roof_problem(
    achieved: float, roof_bandwidth: float, level: str = "DRAM", margin: float = MARGIN
) -> str | None:
    """A stream (bytes/s) above the roof of the level its data lives in by more than `margin`:
    the roof was measured low (or during a stall), not beaten."""
    _positive("roof_bandwidth", roof_bandwidth)
    if achieved > roof_bandwidth * margin:
        return (
            f"{achieved / 1e9:.1f} GB/s is above the {level} roof of "
            f"{roof_bandwidth / 1e9:.1f} GB/s (the roof was measured low)"
        )
    return None


def wait_problem(span: CpuWait, share: float = WAIT_SHARE) -> str | None:
    """This process's threads waited for a CPU more than `share` of the time they wanted one in
    `span`, or a speed path ran steps on fewer threads because another process held a core."""
    totals, fewer = span.totals(), span.fewer_thread_steps()
    if totals is not None and totals[1] >= WAIT_FLOOR_S and totals[1] > share * sum(totals):
        waited = totals[1] / sum(totals)
        return f"its threads waited for a CPU {waited:.0%} of the time (another program ran)"
    if fewer:
        return f"{fewer} decode steps ran on fewer threads (another program held a core)"
    return None


_since_last_verdict = CpuWait()


class MachineProblem(str):
    """A problem found in the machine's state rather than in the numbers (`machine_problem`)."""


def machine_problem(share: float = WAIT_SHARE) -> MachineProblem | None:
    """`wait_problem` since the previous timed verdict, for code that reads its list of problems
    before it prints a verdict (`if not any(problems): ...`); a verdict given it does not check
    the machine a second time."""
    found = wait_problem(_since_last_verdict, share)
    return MachineProblem(found) if found else None


class CannotJudge(str):
    """A reason no run on this machine can support the verdict (a rerun would not help)."""


def stand_in_problem(note: str) -> CannotJudge | None:
    """The roof only bounds the bytes' speed from above (`note` says why: `Roof.note`,
    `RooflineProbe.stand_in_note`): a fraction of it, and the cause it would name, would misread
    the machine."""
    return CannotJudge(note) if note else None


def disturbed(*problems: str | None, most: int = 3) -> str | None:
    """The one line that replaces a verdict when any check found a problem (None otherwise);
    it names the first `most` problems and counts the rest. A reason that no run here could
    settle (`CannotJudge`) is named alone: rerunning would not help."""
    found = [p for p in problems if p]
    if not found:
        return None
    limits = [p for p in found if isinstance(p, CannotJudge)]
    if limits:
        return f"no verdict on this machine: {'; '.join(limits)}"
    named = found[:most] + ([f"{len(found) - most} more"] if len(found) > most else [])
    return f"this run was disturbed: {'; '.join(named)}; rerun on a quiet machine"


def wrap(text: str, width: int = COLUMN, indent: str = "  ") -> str:
    """`text` wrapped to `width`, its later lines indented: a printed line fits the page."""
    lines = []
    for paragraph in text.splitlines() or [""]:
        lines += textwrap.wrap(paragraph, width, subsequent_indent=indent) or [""]
    return "\n".join(lines)


def verdict(
    text: str,
    *problems: str | None,
    prefix: str = "verdict: ",
    timed: bool = True,
    wait_share: float = WAIT_SHARE,
) -> str:
    """`prefix + text` when no check found a problem, else the disturbed line; wrapped. A timed
    verdict also checks that nothing held the cores since the previous one (`wait_problem`; a
    measurement that runs more threads than cores on purpose waits `wait_share` on its own)."""
    if timed:
        if not any(isinstance(problem, MachineProblem) for problem in problems):
            problems = (*problems, machine_problem(wait_share))
        _since_last_verdict.restart()
    line = disturbed(*problems)
    return wrap(line if line else prefix + text)


def band_text(band: float = BAND) -> str:
    """How a comparison's band reads when printed: "within 10% either way"."""
    return f"within {band:.0%} either way"


def compare(a: float, b: float, band: float = BAND, lower_is_faster: bool = True) -> str:
    """ "faster", "slower" or "about the same": how `a` compares with `b`, two-sided.

    a, b: two timings (seconds; `lower_is_faster=False` for rates such as tokens/s). "about the
    same" means neither is more than `band` ahead of the other: a/b and b/a both at most 1 + band.
    """
    _positive("a", a)
    _positive("b", b)
    if not 0 < band < 1:
        raise ValueError(f"band must be between 0 and 1, got {band!r}.")
    ratio = a / b if lower_is_faster else b / a  # above 1: a is slower
    if ratio > 1 + band:
        return "slower"
    if ratio < 1 / (1 + band):
        return "faster"
    return "about the same"


def shorten(text: str, width: int = 40) -> str:
    """`text` cut to `width` characters with an ellipsis: a name of any length (a CPU's, a
    GPU's) prints in a line of known width."""
    if width < 2:
        raise ValueError(f"width must be at least 2, got {width!r}.")
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1].rstrip() + "…"


@dataclass(frozen=True)
class RoofFraction:
    """A speed against the roof it answers to: the fraction, which level's roof, the roof
    (bytes/s), notes that qualify the fraction and problems that void it."""

    fraction: float
    level: str
    roof: float
    notes: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def fraction_of_roof(
    achieved: float,
    roof,
    probe: float | None = None,
    probes: Sequence[float] = (),
    margin: float = MARGIN,
) -> RoofFraction:
    """`achieved` (bytes/s) as a fraction of `roof`, judged three ways.

    roof: a (level, bandwidth, note) triple, as `Measurement.roof_for(nbytes)` returns for the
    working set: a set that fits in a cache answers to the cache's roof, and the fraction says so.
    probe, probes: the bandwidth probed next to the measurement and all of the run's probes; a
    probe far below their median is a stall, and a roof taken then flatters every fraction.
    A fraction above 1 by more than `margin` is a roof measured low: a problem, not a result.
    """
    level, bandwidth, note = roof
    _positive("roof bandwidth", bandwidth)
    notes = []
    if level != "DRAM":
        notes.append(f"the working set fits in the {level} cache: judged against its roof")
    if note:
        notes.append(note)
    problems = [
        roof_problem(achieved, bandwidth, level, margin),
        stall_problem(probe, probes, what="the roof's probe") if probe else None,
    ]
    return RoofFraction(
        achieved / bandwidth, level, bandwidth, tuple(notes), tuple(p for p in problems if p)
    )
