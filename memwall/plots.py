"""Small matplotlib helpers the chapters share: a roofline and a stacked bytes bar.

Each helper draws on an ``Axes`` you pass in and returns what it computed, so a chapter keeps
control of its figure layout (panels, titles, sizes) and can print the same numbers it plotted.

- ``roofline``: attainable FLOP/s = min(peak, intensity x bandwidth) on log-log axes, one line per
  chip, with the ridge point (peak / bandwidth) marked, plus optional measured points. The model
  is Williams, Waterman & Patterson, "Roofline" (CACM 2009).
- ``ledger_roofline``: a chip's roofline with the cost model's two rows, weight matmuls and
  attention, as points for each case (batch, context, KV heads): batching moves the matmuls right,
  past the ridge, while attention stays where the KV heads put it (H/G FLOPs per byte in 16-bit).
- ``memory_level_roofs``: the measured machine as one roof per memory level (DRAM, and the
  last-level cache where it was timed): a working set that fits in the cache answers to the
  steeper one, so a plot of such a machine shows both.
- ``memory_bar``: one or more stacked bars of bytes (weights, KV cache, activations, ...), with an
  optional capacity line, for "what fills the memory" and "what a step reads" pictures.

matplotlib is imported by the caller's ``Axes``; this module only needs numpy and memwall.cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from memwall import cost
from memwall.cost import peak_flops
from memwall.hardware import Hardware
from memwall.machine.caches import DRAM, cache_levels
from memwall.machine.microbench import get_hardware

DEFAULT_INTENSITY_RANGE = (0.1, 1e4)  # FLOPs per byte: from a matvec to a big square matmul
BYTE_UNITS = {
    "B": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


def attainable_flops(intensity, peak_flops_per_s: float, bandwidth: float):
    """The roofline itself: min(peak FLOP/s, intensity x bytes/s), elementwise for arrays."""
    if not (peak_flops_per_s > 0 and bandwidth > 0):
        raise ValueError(
            f"peak_flops_per_s and bandwidth must be positive, got "
            f"{peak_flops_per_s!r} and {bandwidth!r}."
        )
    return np.minimum(peak_flops_per_s, np.asarray(intensity, dtype=float) * bandwidth)


def _as_list(value, length: int, what: str) -> list:
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [value] * length
    if len(value) != length:
        raise ValueError(f"{what}: expected one entry per hardware ({length}), got {len(value)}.")
    return list(value)


def roofline(
    ax,
    hardware,
    dtype="bf16",
    points: Mapping | None = None,
    intensity_range=DEFAULT_INTENSITY_RANGE,
    mark_ridge: bool = True,
    labels=None,
    colors=None,
    flops_unit: float = 1e9,
    flops_unit_name: str = "GFLOP/s",
) -> list[dict]:
    """Draw the roofline of one or more chips on ``ax`` (log-log) and return what was drawn.

    hardware: a `Hardware`, a catalog name ("h100-sxm", "this"), or a list of them.
    dtype: the compute dtype whose peak is the flat roof ("bf16", "fp32", ...), one for all chips
        or a list with one per chip. A chip without that dtype falls back as `cost.peak_flops` does.
    points: optional measurements, ``{label: (intensities, flop_rates)}`` in FLOPs/byte and FLOP/s,
        drawn as markers.
    intensity_range: (low, high) FLOPs/byte of the horizontal axis.
    labels, colors: legend labels and colors per chip (default: the hardware's name, C0, C1, ...).
    flops_unit, flops_unit_name: the vertical axis unit (default GFLOP/s; use 1e12, "TFLOP/s" for GPUs).

    Returns one dict per chip: name, dtype, bandwidth (bytes/s), peak (FLOP/s), ridge (FLOPs/byte).
    """
    chips = [
        get_hardware(h) for h in (hardware if isinstance(hardware, (list, tuple)) else [hardware])
    ]
    if not chips:
        raise ValueError("roofline needs at least one hardware entry, e.g. 'h100-sxm' or 'this'.")
    low, high = intensity_range
    if not 0 < low < high:
        raise ValueError(
            f"intensity_range must be (low, high) with 0 < low < high, got {intensity_range!r}."
        )
    dtypes = _as_list(dtype, len(chips), "dtype")
    labels = (
        _as_list(labels, len(chips), "labels") if labels is not None else [c.name for c in chips]
    )
    colors = (
        _as_list(colors, len(chips), "colors")
        if colors is not None
        else [f"C{i}" for i in range(len(chips))]
    )
    intensity = np.geomspace(low, high, 400)
    drawn = []
    for chip, chip_dtype, label, color in zip(chips, dtypes, labels, colors):
        peak = peak_flops(chip, chip_dtype)
        ridge = peak / chip.memory_bandwidth
        roof = attainable_flops(intensity, peak, chip.memory_bandwidth)
        ax.plot(
            intensity,
            roof / flops_unit,
            color=color,
            linewidth=2,
            label=f"{label}: {chip.memory_bandwidth / 1e9:,.0f} GB/s, {peak / flops_unit:,.3g} {flops_unit_name}",
        )
        if mark_ridge and low <= ridge <= high:
            ax.axvline(ridge, color=color, linestyle=":", linewidth=1)
            ax.plot([ridge], [peak / flops_unit], "o", color=color, markersize=6)
            ax.annotate(
                f"ridge {ridge:,.3g}",
                (ridge, peak / flops_unit),
                textcoords="offset points",
                xytext=(6, -14),
                color=color,
                fontsize=9,
            )
        drawn.append(
            dict(
                name=chip.name,
                dtype=chip_dtype,
                bandwidth=chip.memory_bandwidth,
                peak=peak,
                ridge=ridge,
            )
        )
    markers = "sD^vP*X"
    for index, (label, (xs, ys)) in enumerate((points or {}).items()):
        ax.plot(
            np.asarray(xs, dtype=float),
            np.asarray(ys, dtype=float) / flops_unit,
            markers[index % len(markers)],
            color=f"C{len(chips) + index}",
            markersize=6,
            label=label,
            linestyle="none",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel(f"attainable {flops_unit_name}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return drawn


def memory_level_roofs(measurement, levels=None) -> list[tuple[str, Hardware]]:
    """(label, Hardware) per memory level `measurement` timed, slowest first, for `roofline`.

    Each level has the same flat roof (the measured peaks) and its own slope: DRAM's bandwidth,
    and the last-level cache's where `measure()` timed it. Where the memory budget could not
    reach DRAM, the one roof is the cache's and its label says so. `levels` defaults to this
    CPU's cache levels (they only name the cache: "L3")."""
    levels = cache_levels() if levels is None else levels
    cache_name = f"{levels[-1].name} cache" if levels else "last-level cache"
    base = measurement.as_hardware()
    if measurement.memory_level != DRAM:  # both streams read the cache: the faster is its roof
        fastest = max(measurement.bandwidth, measurement.cache_bandwidth or 0.0)
        only = Hardware(base.name, fastest, dict(base.peak_flops), base.memory_bytes, base.note)
        return [(f"{cache_name} (measured; DRAM out of reach)", only)]
    roofs = [("DRAM (measured)", base)]
    if measurement.cache_bandwidth and measurement.cache_bandwidth > measurement.bandwidth:
        cache = Hardware(
            f"{base.name}-cache",
            measurement.cache_bandwidth,
            dict(base.peak_flops),
            base.memory_bytes,
            f"the last-level cache's read bandwidth; {base.note}",
        )
        roofs.append((f"{cache_name} (measured)", cache))
    return roofs


ROW_MARKERS = {"weight matmuls": "s", "attention": "^"}


def ledger_roofline(
    ax,
    model,
    hardware,
    cases: Sequence[Mapping],
    dtype: str = "bf16",
    flops_unit: float = 1e12,
    flops_unit_name: str = "TFLOP/s",
    annotate: bool = True,
) -> list[dict]:
    """The roofline of `hardware` with both ledger rows of `model` as points, for each case.

    cases: dicts of `cost.calc` options with a "label", e.g.
        [{"label": "B=1", "batch": 1}, {"label": "B=1024", "batch": 1024, "context": 1024}]
        (keys: batch, context, kv_heads, kv_dtype; context defaults to 1024).
    Each point sits on the roof at its row's intensity: the FLOP/s that row attains at its floor.
    Returns one dict per (case, row): label, row, intensity, flop_rate, bound, time_s.
    """
    if not cases:
        raise ValueError("ledger_roofline needs at least one case, e.g. [{'label': 'B=1'}].")
    rows = []
    for case in cases:
        options = {k: v for k, v in case.items() if k != "label"}
        unknown = set(options) - {"batch", "context", "kv_heads", "kv_dtype"}
        if unknown:
            raise ValueError(
                f"unknown case keys {sorted(unknown)}; choose from batch, context, kv_heads, kv_dtype."
            )
        result = cost.calc(model, hardware, dtype, **{"context": 1024, **options})
        for row, prefix in (("weight matmuls", "matmul"), ("attention", "attention")):
            rows.append(
                {
                    "label": case.get("label", ""),
                    "row": row,
                    "intensity": result[f"{prefix}_arithmetic_intensity"],
                    "flop_rate": result[f"{prefix}_flops"] / result[f"{prefix}_time_s"],
                    "bound": result[f"{prefix}_bound"],
                    "time_s": result[f"{prefix}_time_s"],
                }
            )
    intensities = [r["intensity"] for r in rows]
    chip = get_hardware(hardware)
    ridge = peak_flops(chip, cost.compute_dtype_for(dtype)) / chip.memory_bandwidth
    low = min(min(intensities), ridge) / 4
    high = max(max(intensities), ridge) * 4
    roofline(
        ax,
        chip,
        dtype=cost.compute_dtype_for(dtype),
        intensity_range=(low, high),
        flops_unit=flops_unit,
        flops_unit_name=flops_unit_name,
    )
    for row_name, marker in ROW_MARKERS.items():
        mine = [r for r in rows if r["row"] == row_name]
        ax.plot(
            [r["intensity"] for r in mine],
            [r["flop_rate"] / flops_unit for r in mine],
            marker,
            color="C3" if row_name == "attention" else "C2",
            markersize=7,
            linestyle="none",
            label=row_name,
        )
        if annotate:  # points that coincide (attention at any batch) share one label
            spots: dict[tuple, list[str]] = {}
            for r in mine:
                spot = (float(f"{r['intensity']:.2g}"), float(f"{r['flop_rate']:.2g}"))
                spots.setdefault(spot, []).append(r["label"])
            placed: list[tuple[float, float]] = []
            for (x, y), labels in spots.items():
                # Stack the labels of nearby points (within 30%) instead of printing them over each other.
                near = sum(
                    abs(np.log(x / px)) < 0.3 and abs(np.log(y / py)) < 0.3 for px, py in placed
                )
                placed.append((x, y))
                step = 12 if row_name == "attention" else -12
                ax.annotate(
                    ", ".join(labels),
                    (x, y / flops_unit),
                    textcoords="offset points",
                    xytext=(6, (6 if row_name == "attention" else -14) + near * step),
                    fontsize=9,
                )
    ax.legend(loc="lower right", fontsize=8)
    return rows


def memory_bar(
    ax,
    bars: Mapping[str, Mapping[str, float]],
    capacity: float | None = None,
    capacity_label: str = "capacity",
    unit: str = "GB",
    horizontal: bool = True,
    colors: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Stacked bars of bytes, one bar per entry of ``bars``: ``{bar label: {part label: bytes}}``.

    Parts with the same label share a color and a legend entry across bars (e.g. "weights",
    "KV cache"). ``capacity`` (bytes) draws a line such as a GPU's memory size. ``unit`` is one of
    BYTE_UNITS. Returns the total bytes of each bar.
    """
    if unit not in BYTE_UNITS:
        raise ValueError(f"Unknown unit {unit!r}; choose from {', '.join(BYTE_UNITS)}.")
    if not bars:
        raise ValueError(
            "memory_bar needs at least one bar, e.g. {'Llama 3 8B': {'weights': 16e9}}."
        )
    scale = BYTE_UNITS[unit]
    part_names = list(dict.fromkeys(part for parts in bars.values() for part in parts))
    colors = {**{part: f"C{i}" for i, part in enumerate(part_names)}, **(colors or {})}
    positions = np.arange(len(bars))
    offsets = np.zeros(len(bars))
    for part in part_names:
        sizes = np.array([parts.get(part, 0.0) for parts in bars.values()], dtype=float)
        if (sizes < 0).any():
            raise ValueError(f"part {part!r} has a negative size; bytes must be >= 0.")
        draw = ax.barh if horizontal else ax.bar
        kwargs = {"left": offsets / scale} if horizontal else {"bottom": offsets / scale}
        draw(positions, sizes / scale, 0.6, color=colors[part], label=part, **kwargs)
        offsets += sizes
    axis_label = f"bytes ({unit})"
    if horizontal:
        ax.set_yticks(positions, list(bars))
        ax.set_xlabel(axis_label)
    else:
        ax.set_xticks(positions, list(bars))
        ax.set_ylabel(axis_label)
    if capacity is not None:
        (ax.axvline if horizontal else ax.axhline)(
            capacity / scale, color="black", linestyle="--", linewidth=1, label=capacity_label
        )
    ax.legend(loc="best", fontsize=8)
    return dict(zip(bars, offsets.tolist()))


def book_style(figure_format: str = "svg") -> None:
    """The book's figure settings; every chapter calls this once, after importing matplotlib.

    Figures are drawn as SVG (sharp at any screen density, text stays text) where the notebook
    runs under IPython, and as 2x PNG when saved elsewhere. The font sizes are chosen so that an
    11-inch-wide two-panel figure, scaled down to the book's content column, still reads at about
    the size of the body text.
    """
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "font.size": 12,
            "axes.titlesize": 12,
            "axes.labelsize": 12,
            "legend.fontsize": 10,
            "xtick.labelsize": 11,
            "ytick.labelsize": 11,
            "savefig.dpi": 200,
            "figure.dpi": 100,
        }
    )
    try:  # only inside IPython/Jupyter: choose what the inline backend sends to the page
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    if get_ipython() is not None:
        set_matplotlib_formats(figure_format)
