"""A measured speed against its ceiling and against a baseline, reported the way it should be read.

The ceiling is min(memory roof, compute roof), never the memory roof alone: batch 8 of a small
model on a CPU can be limited by the matmuls long before the weight reads, and a "% of roofline"
over the memory roof would then flatter nothing and blame the wrong thing. And a technique that
makes decoding slower than the plain baseline is a slowdown, "0.33x baseline, slower", not
"39% of ceiling", which reads as a modest success.

Pure arithmetic, no torch: chapter 9's table and the benchmarks use the same functions.
"""

from __future__ import annotations

from typing import NamedTuple


class Ceiling(NamedTuple):
    """Tokens/s each roof allows, the lower of the two, and which roof that is."""

    memory_roof: float
    compute_roof: float  # inf when no peak FLOP/s is known
    ceiling: float
    bound: str  # "memory" or "compute"


def ceiling(
    bytes_per_step: float,
    flops_per_step: float,
    bandwidth: float,
    peak_flops: float | None,
    tokens_per_step: float = 1,
) -> Ceiling:
    """tokens/s <= tokens_per_step / max(bytes / bandwidth, FLOPs / peak FLOP/s).

    bandwidth in bytes/s, peak_flops in FLOP/s (None: compute roof unknown, memory roof alone);
    tokens_per_step: B for batch B, tokens a step produces.
    """
    for name, value in (("bytes_per_step", bytes_per_step), ("bandwidth", bandwidth)):
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}.")
    if not tokens_per_step > 0:
        raise ValueError(f"tokens_per_step must be positive, got {tokens_per_step!r}.")
    memory_roof = tokens_per_step * bandwidth / bytes_per_step
    compute_roof = (
        tokens_per_step * peak_flops / flops_per_step
        if peak_flops and flops_per_step > 0
        else float("inf")
    )
    if compute_roof < memory_roof:
        return Ceiling(memory_roof, compute_roof, compute_roof, "compute")
    return Ceiling(memory_roof, compute_roof, memory_roof, "memory")


def times_baseline(tok_per_s: float, baseline_tok_per_s: float) -> float:
    """The "x baseline" column: measured tokens/s over the plain baseline's, from the same run."""
    if not baseline_tok_per_s > 0:
        raise ValueError(f"baseline_tok_per_s must be positive, got {baseline_tok_per_s!r}.")
    return tok_per_s / baseline_tok_per_s


def standing(
    tok_per_s: float, ceiling_tok_per_s: float, baseline_tok_per_s: float | None = None
) -> str:
    """One cell for a table of techniques: "0.33x baseline: slower" for a slowdown, else the
    fraction of the ceiling (with the x baseline when a baseline is given)."""
    if baseline_tok_per_s is not None:
        ratio = times_baseline(tok_per_s, baseline_tok_per_s)
        if ratio < 1:
            return f"{ratio:.2f}x baseline: slower"
        return f"{ratio:.2f}x baseline, {tok_per_s / ceiling_tok_per_s:.0%} of ceiling"
    return f"{tok_per_s / ceiling_tok_per_s:.0%} of ceiling"


def technique_row(
    name: str,
    tok_per_s: float,
    bytes_per_step: float,
    flops_per_step: float,
    bandwidth: float,
    peak_flops: float | None,
    tokens_per_step: float = 1,
    baseline_tok_per_s: float | None = None,
) -> dict:
    """One row of chapter 9's table: the two roofs, the ceiling, x baseline and the verdict.

    `fraction_of_ceiling` is None for a slowdown, so that no one quotes it as a success.
    """
    roofs = ceiling(bytes_per_step, flops_per_step, bandwidth, peak_flops, tokens_per_step)
    slower = baseline_tok_per_s is not None and tok_per_s < baseline_tok_per_s
    return {
        "technique": name,
        "tok_per_s": tok_per_s,
        "memory_roof_tok_per_s": roofs.memory_roof,
        "compute_roof_tok_per_s": roofs.compute_roof,
        "ceiling_tok_per_s": roofs.ceiling,
        "bound": roofs.bound,
        "times_baseline": (
            None if baseline_tok_per_s is None else times_baseline(tok_per_s, baseline_tok_per_s)
        ),
        "slower": slower,
        "fraction_of_ceiling": None if slower else tok_per_s / roofs.ceiling,
        "verdict": standing(tok_per_s, roofs.ceiling, baseline_tok_per_s),
    }
