"""memwall.plots draws what it says: roofline lines, ridge points, stacked byte bars."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from memwall.hardware import CATALOG, Hardware  # noqa: E402
from memwall.plots import attainable_flops, memory_bar, roofline  # noqa: E402


@pytest.fixture
def ax():
    figure, axes = plt.subplots()
    yield axes
    plt.close(figure)


def test_attainable_flops_is_the_minimum_of_the_two_roofs():
    got = attainable_flops([0.5, 2.0, 100.0], peak_flops_per_s=1e12, bandwidth=1e11)
    assert np.allclose(got, [5e10, 2e11, 1e12])
    with pytest.raises(ValueError):
        attainable_flops(1.0, peak_flops_per_s=0, bandwidth=1e11)


def test_roofline_reports_the_h100_ridge_point(ax):
    (h100,) = roofline(ax, "h100-sxm", dtype="bf16", flops_unit=1e12, flops_unit_name="TFLOP/s")
    assert h100["peak"] == 989e12 and h100["bandwidth"] == 3.35e12
    assert h100["ridge"] == pytest.approx(295.2, abs=0.1)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    roof = ax.get_lines()[0]
    x, y = roof.get_data()
    # Left of the ridge the line is bandwidth x intensity; right of it, the flat peak.
    assert y[0] == pytest.approx(x[0] * 3.35e12 / 1e12)
    assert y[-1] == pytest.approx(989)


def test_roofline_takes_several_chips_dtypes_and_points(ax):
    cpu = Hardware("toy-cpu", memory_bandwidth=20e9, peak_flops={"fp32": 60e9}, memory_bytes=16e9)
    drawn = roofline(
        ax,
        [cpu, CATALOG["a100-80gb"]],
        dtype=["fp32", "bf16"],
        points={"measured": ([0.5, 5.0], [9e9, 55e9])},
    )
    assert [d["name"] for d in drawn] == ["toy-cpu", "a100-80gb"]
    assert drawn[0]["ridge"] == pytest.approx(3.0)
    assert drawn[1]["peak"] == 312e12
    labels = [line.get_label() for line in ax.get_lines()]
    assert "measured" in labels
    measured = next(line for line in ax.get_lines() if line.get_label() == "measured")
    assert np.allclose(measured.get_ydata(), [9.0, 55.0])  # in the default GFLOP/s


def test_roofline_rejects_bad_input(ax):
    with pytest.raises(ValueError, match="choose from"):
        roofline(ax, "no-such-gpu")
    with pytest.raises(ValueError, match="intensity_range"):
        roofline(ax, "h100-sxm", intensity_range=(10, 1))
    with pytest.raises(ValueError, match="one entry per hardware"):
        roofline(ax, ["h100-sxm", "l4"], dtype=["bf16"])


def test_memory_bar_stacks_parts_and_returns_totals(ax):
    totals = memory_bar(
        ax,
        {
            "1 user": {"weights": 16e9, "KV cache": 1e9},
            "16 users": {"weights": 16e9, "KV cache": 16e9},
        },
        capacity=80e9,
        unit="GB",
    )
    assert totals == {"1 user": 17e9, "16 users": 32e9}
    kv_bars = [patch for patch in ax.patches if patch.get_x() > 0]
    assert sorted(round(p.get_width()) for p in kv_bars) == [1, 16]
    assert any(line.get_label() == "capacity" for line in ax.get_lines())


def test_memory_bar_rejects_bad_input(ax):
    with pytest.raises(ValueError, match="choose from"):
        memory_bar(ax, {"a": {"weights": 1.0}}, unit="gigabytes")
    with pytest.raises(ValueError, match="negative"):
        memory_bar(ax, {"a": {"weights": -1.0}})
    with pytest.raises(ValueError, match="at least one bar"):
        memory_bar(ax, {})


def test_ledger_roofline_puts_both_rows_on_the_roof(ax):
    from memwall.plots import ledger_roofline

    rows = ledger_roofline(
        ax,
        "llama-3-8b",
        "h100-sxm",
        [
            {"label": "B=1", "batch": 1},
            {"label": "B=1024", "batch": 1024, "context": 1024},
            {"label": "MHA", "batch": 1, "kv_heads": 32},
        ],
    )
    by = {(r["label"], r["row"]): r for r in rows}
    assert len(rows) == 6
    assert by["B=1024", "weight matmuls"]["bound"] == "compute"
    assert by["B=1024", "attention"]["bound"] == "memory"
    assert by["B=1", "weight matmuls"]["bound"] == "memory"
    # GQA (8 KV heads for 32) puts attention at 4 FLOPs/byte, MHA at 1.
    assert by["B=1", "attention"]["intensity"] == pytest.approx(4.0)
    assert by["MHA", "attention"]["intensity"] == pytest.approx(1.0)
    # A compute-bound point sits on the flat roof; a memory-bound one on the slope.
    assert by["B=1024", "weight matmuls"]["flop_rate"] == pytest.approx(989e12)
    assert by["B=1", "attention"]["flop_rate"] == pytest.approx(4.0 * 3.35e12)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "weight matmuls" in labels and "attention" in labels
    with pytest.raises(ValueError, match="choose from batch"):
        ledger_roofline(ax, "llama-3-8b", "h100-sxm", [{"label": "x", "users": 3}])


def _measurement(**overrides):
    from memwall.machine.measurement import Measurement

    fields = dict(
        device="a CPU",
        device_type="cpu",
        torch_version="2",
        threads=2,
        bandwidth=30e9,
        read_bandwidth=30e9,
        copy_bandwidth=25e9,
        flops={"fp32": 300e9},
        memory_bytes=8e9,
        cache_bandwidth=120e9,
    )
    return Measurement(**{**fields, **overrides})


def test_memory_level_roofs_draw_the_cache_beside_dram(ax):
    from memwall.machine.caches import CacheLevel
    from memwall.plots import memory_level_roofs

    levels = (CacheLevel(2, 2**21, 1), CacheLevel(3, 480 * 2**20, 2))
    roofs = memory_level_roofs(_measurement(), levels)
    assert [label for label, _ in roofs] == ["DRAM (measured)", "L3 cache (measured)"]
    assert [hw.memory_bandwidth for _, hw in roofs] == [30e9, 120e9]
    assert all(hw.peak_flops == {"fp32": 300e9} for _, hw in roofs)
    drawn = roofline(ax, [hw for _, hw in roofs], dtype="fp32", labels=[s for s, _ in roofs])
    # the same flat roof, a steeper slope: the cache's ridge sits 4x further left
    assert drawn[0]["ridge"] == pytest.approx(4 * drawn[1]["ridge"])
    # no cache measured (a GPU), or a cache no faster than DRAM: one roof
    assert len(memory_level_roofs(_measurement(cache_bandwidth=None), levels)) == 1
    # DRAM out of reach within the memory budget: the one roof is the cache's, and says so
    (only,) = memory_level_roofs(_measurement(memory_level="last-level cache"), levels)
    assert "DRAM out of reach" in only[0]
    assert only[1].memory_bandwidth == 120e9  # the faster of the two cache streams
