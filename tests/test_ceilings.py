"""Ceilings are min(memory roof, compute roof); slowdowns are reported as slowdowns."""

import math

import pytest

from memwall.ceilings import ceiling, standing, technique_row, times_baseline


def test_batch_8_on_a_cpu_is_compute_bound():
    # Batch 8 of SmolLM2-135M fp32 (538 MB, 0.27 GFLOP per token) on a 2-core CPU at 75 GB/s and
    # 211 GFLOP/s: the memory roof alone says 1,115 tok/s, but the compute roof is about 780.
    roofs = ceiling(538e6, 8 * 0.27e9, 75e9, 211e9, tokens_per_step=8)
    assert round(roofs.memory_roof) == 1115 and round(roofs.compute_roof) == 781
    assert roofs.ceiling == roofs.compute_roof and roofs.bound == "compute"


def test_batch_1_is_memory_bound_and_no_peak_means_memory_roof_alone():
    roofs = ceiling(538e6, 0.27e9, 75e9, 211e9)
    assert roofs.bound == "memory" and roofs.ceiling == pytest.approx(75e9 / 538e6)
    alone = ceiling(538e6, 0.27e9, 75e9, None)
    assert alone.compute_roof == math.inf and alone.ceiling == roofs.ceiling


def test_a_slowdown_is_reported_as_one():
    assert times_baseline(20, 60) == pytest.approx(1 / 3)
    assert standing(20, 51, baseline_tok_per_s=60) == "0.33x baseline: slower"
    assert standing(90, 100, baseline_tok_per_s=60) == "1.50x baseline, 90% of ceiling"
    assert standing(45, 100) == "45% of ceiling"
    row = technique_row("self-draft", 20, 538e6, 0.27e9, 75e9, 211e9, baseline_tok_per_s=60)
    assert row["slower"] and row["fraction_of_ceiling"] is None
    assert row["verdict"] == "0.33x baseline: slower"
    row = technique_row("batch 8", 700, 538e6, 8 * 0.27e9, 75e9, 211e9, 8, baseline_tok_per_s=60)
    assert not row["slower"] and row["bound"] == "compute"
    assert row["fraction_of_ceiling"] == pytest.approx(700 / row["compute_roof_tok_per_s"])


@pytest.mark.parametrize("args", [(0, 1, 1, 1), (1, 1, 0, 1), (1, 1, 1, 1, 0)])
def test_bad_inputs_raise(args):
    with pytest.raises(ValueError, match="must be positive"):
        ceiling(*args)
    with pytest.raises(ValueError, match="baseline"):
        times_baseline(1, 0)
