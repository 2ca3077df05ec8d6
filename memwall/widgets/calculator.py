"""The "How big is the cache?" calculator: a model and a GPU from the catalogs, dtypes, context,
users and KV heads in; a stacked memory bar (weights, KV cache, free), the most users that fit and
the tokens/s ceilings out.

Every figure comes from `memwall.cost.calc`; this module only adds what the drawing needs (bar
fractions, MHA/GQA/MQA label) and the displayed text. `static_calculator` ships the same
calculator as HTML + JavaScript for pages without a kernel; its JS (`calculator_core.js`) repeats
`figures` and `displayed` formula for formula, and tests/test_calculator.py checks that both give
the same numbers and the same text.
"""

from __future__ import annotations

import html as html_escape
import math

from memwall import cost
from memwall.hardware import CATALOG as HARDWARE
from memwall.specs import CATALOG as MODELS
from memwall.specs import get_spec

WEIGHT_DTYPES = ["bf16", "fp16", "fp32", "fp8", "int8", "int8-g128", "int4-g128", "int4", "q4_1"]
KV_DTYPES = [
    ("same as compute", None),
    ("bf16", "bf16"),
    ("fp16", "fp16"),
    ("fp32", "fp32"),
    ("fp8", "fp8"),
    ("int8", "int8"),
    ("int4", "int4"),
]
CONTEXTS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
DEFAULTS = dict(
    model="llama-3-8b",
    hardware="h100-sxm",
    dtype="bf16",
    kv_dtype=None,
    context=8192,
    batch=16,
    kv_heads=None,
)
COLORS = {"weights": "#4c72b0", "kv": "#dd8452", "free": "#e5e5e5", "over": "#c44e52"}


def kv_head_choices(model) -> list[int]:
    """KV-head counts the model's query heads can be grouped into (gpt2 has plain MHA only)."""
    spec = get_spec(model)
    if spec.arch == "gpt2":
        return [spec.n_heads]
    return [n for n in range(1, spec.n_heads + 1) if spec.n_heads % n == 0]


def figures(
    model, hardware, dtype="bf16", kv_dtype=None, context=1024, batch=1, kv_heads=None
) -> dict:
    """`cost.calc`'s dict plus the calculator's extras (MHA ratio, memory-bar fractions)."""
    result = cost.calc(
        model,
        hardware,
        dtype=dtype,
        context=context,
        batch=batch,
        kv_dtype=kv_dtype,
        kv_heads=kv_heads,
    )
    spec = get_spec(model)
    n_heads, n_kv = spec.n_heads, result["n_kv_heads"]
    needed, memory = result["memory_needed_bytes"], result["memory_bytes"]
    scale = max(memory, needed)
    return {
        **result,
        "n_heads": n_heads,
        "n_kv_heads_published": spec.n_kv_heads,
        "attention": "MHA" if n_kv == n_heads else ("MQA" if n_kv == 1 else "GQA"),
        "mha_kv_ratio": n_heads / n_kv,
        "free_bytes": max(0, memory - needed),
        "weight_fraction": result["weight_storage_bytes"] / scale,
        "kv_fraction": result["kv_bytes_total"] / scale,
        "free_fraction": max(0, memory - needed) / scale,
        "memory_fraction": memory / scale,
    }


# ---- displayed text: the same rounding rules as calculator_core.js ---------------------------------


def round_to(x: float, decimals: int) -> float:
    """Half-up rounding written as floor(x * 10^d + 0.5), so Python and JS round identically."""
    p = 10**decimals
    return math.floor(x * p + 0.5) / p


def group_thousands(n) -> str:
    return f"{int(n):,}"


def format_number(x: float) -> str:
    """Three or four significant figures; thousands grouped."""
    if x == 0:
        return "0"
    if x >= 1000:
        return group_thousands(math.floor(x + 0.5))
    decimals = 0 if x >= 100 else 1 if x >= 10 else 2 if x >= 1 else 3
    return f"{round_to(x, decimals):.{decimals}f}"


BYTE_UNITS = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")]


def format_bytes(b: float) -> str:
    """Decimal units, like the GPU datasheets (80 GB = 80e9 bytes)."""
    for scale, unit in BYTE_UNITS:
        if b >= scale:
            return f"{format_number(b / scale)} {unit}"
    return f"{format_number(b)} B"


def displayed(f: dict) -> dict[str, str]:
    """Every piece of text the calculator shows, keyed like calculator_core.js's `displayed`."""
    short = f["memory_needed_bytes"] - f["memory_bytes"]
    return {
        "attention": f"{f['attention']}: {f['n_kv_heads']} KV head{'' if f['n_kv_heads'] == 1 else 's'} "
        f"for {f['n_heads']} query heads",
        "mha_kv_ratio": f"{format_number(f['mha_kv_ratio'])}\u00d7",
        "weights": format_bytes(f["weight_storage_bytes"]),
        "kv_per_token": f"{format_number(f['kv_bytes_per_token'] / 1024)} KiB",
        "kv_per_user": format_bytes(f["kv_bytes_per_user"]),
        "kv_total": format_bytes(f["kv_bytes_total"]),
        "needed": format_bytes(f["memory_needed_bytes"]),
        "memory": format_bytes(f["memory_bytes"]),
        "free": format_bytes(f["free_bytes"]) if f["fits"] else f"short by {format_bytes(short)}",
        "max_users": group_thousands(f["max_users"]),
        "tokens_per_s_per_user": format_number(f["tokens_per_s_per_user"]),
        "tokens_per_s_total": format_number(f["tokens_per_s_total"]),
        "step_time": f"{format_number(f['step_time_s'] * 1000)} ms",
        "bound": f["bound"]
        if f["bound"] != "mixed"
        else f"matmuls: {f['matmul_bound']}, attention: {f['attention_bound']}",
    }


# The rows of the results table: (label, key in `displayed`). static_calculator uses the same list.
RESULT_ROWS = [
    ("Attention", "attention"),
    ("MHA would need", "mha_kv_ratio"),
    ("Weights", "weights"),
    ("KV cache per token", "kv_per_token"),
    ("KV cache per user", "kv_per_user"),
    ("KV cache, all users", "kv_total"),
    ("Memory needed", "needed"),
    ("GPU memory", "memory"),
    ("Free", "free"),
    ("Max users that fit", "max_users"),
    ("Ceiling, tok/s per user", "tokens_per_s_per_user"),
    ("Ceiling, tok/s total", "tokens_per_s_total"),
    ("Step time at least", "step_time"),
    ("Bound by", "bound"),
]


def bar_segments(f: dict) -> list[tuple[str, float, str]]:
    """(name, percent of the bar, color): weights, KV cache, then free or the overflow."""
    segments = [
        ("weights", f["weight_fraction"], COLORS["weights"]),
        ("KV cache", f["kv_fraction"], COLORS["kv"]),
    ]
    segments.append(
        ("free", f["free_fraction"], COLORS["free"])
        if f["fits"]
        else ("over", 1 - f["memory_fraction"], COLORS["over"])
    )
    return [(name, 100 * fraction, color) for name, fraction, color in segments]


def render_html(f: dict) -> str:
    """The memory bar and the results table, as HTML (what the widget shows)."""
    text = displayed(f)
    bar = "".join(
        f'<div title="{name}" style="width:{percent:.4f}%;background:{color}"></div>'
        for name, percent, color in bar_segments(f)
    )
    marker = (
        ""
        if f["fits"]
        else (
            f'<div class="mw-limit" style="left:{100 * f["memory_fraction"]:.4f}%"'
            ' title="GPU memory"></div>'
        )
    )
    rows = "".join(
        f"<tr><td>{label}</td><td>{html_escape.escape(text[key])}</td></tr>"
        for label, key in RESULT_ROWS
    )
    legend = (
        f'<span style="color:{COLORS["weights"]}">&#9632;</span> weights {text["weights"]} &nbsp; '
        f'<span style="color:{COLORS["kv"]}">&#9632;</span> KV cache {text["kv_total"]} &nbsp; '
        f"of {text['memory']}"
    )
    return (
        f'<div class="mw-calc-out"><div class="mw-bar">{bar}{marker}</div>'
        f'<div class="mw-legend">{legend}</div><table class="mw-table">{rows}</table></div>'
    )


STYLE = """<style>
.mw-bar{position:relative;display:flex;height:26px;border:1px solid #888;border-radius:3px;overflow:hidden;margin:6px 0}
.mw-bar>div{height:100%}
.mw-limit{position:absolute;top:0;bottom:0;width:2px;background:#000}
.mw-legend{font-size:90%;margin-bottom:6px}
.mw-table td{padding:1px 10px 1px 0;text-align:left}
.mw-table td:last-child{font-weight:bold;font-variant-numeric:tabular-nums}
.mw-error{color:#c44e52;font-weight:bold}
</style>"""


def cache_calculator(**overrides):
    """The ipywidgets calculator (Jupyter, Colab). Keyword arguments set the starting inputs:
    model, hardware, dtype, kv_dtype, context, batch (users), kv_heads (None = as published)."""
    import ipywidgets as widgets

    start = {**DEFAULTS, **overrides}
    unknown = set(start) - set(DEFAULTS)
    if unknown:
        raise ValueError(
            f"Unknown calculator inputs {sorted(unknown)}; choose from {', '.join(DEFAULTS)}."
        )
    model = widgets.Dropdown(
        options=list(MODELS), value=get_spec(start["model"]).name, description="model"
    )
    gpu = widgets.Dropdown(options=list(HARDWARE), value=start["hardware"], description="GPU")
    dtype = widgets.Dropdown(options=WEIGHT_DTYPES, value=start["dtype"], description="weights")
    kv_dtype = widgets.Dropdown(options=KV_DTYPES, value=start["kv_dtype"], description="KV dtype")
    context = widgets.SelectionSlider(
        options=_contexts(start["model"], start["context"]),
        value=start["context"],
        description="context",
        continuous_update=False,
    )
    users = widgets.BoundedIntText(value=start["batch"], min=1, max=100_000, description="users")
    kv_heads = widgets.Dropdown(
        options=_kv_options(start["model"]), value=start["kv_heads"], description="KV heads"
    )
    output = widgets.HTML()

    def update(*_):
        try:
            f = figures(
                model.value,
                gpu.value,
                dtype.value,
                kv_dtype.value,
                context.value,
                users.value,
                kv_heads.value,
            )
            output.value = STYLE + render_html(f)
        except ValueError as error:
            output.value = STYLE + f'<div class="mw-error">{html_escape.escape(str(error))}</div>'

    def model_changed(change):
        keep_context, keep_heads = context.value, kv_heads.value
        context.options = _contexts(change["new"], keep_context)
        context.value = min(keep_context, get_spec(change["new"]).max_context)
        kv_heads.options = _kv_options(change["new"])
        kv_heads.value = keep_heads if keep_heads in kv_head_choices(change["new"]) else None

    model.observe(model_changed, names="value")
    for control in (model, gpu, dtype, kv_dtype, context, users, kv_heads):
        control.observe(update, names="value")
    update()
    return widgets.VBox(
        [
            widgets.HBox([model, gpu]),
            widgets.HBox([dtype, kv_dtype]),
            widgets.HBox([context, users]),
            kv_heads,
            output,
        ]
    )


def _contexts(model, current) -> list[int]:
    top = get_spec(model).max_context
    return sorted(
        {c for c in CONTEXTS if c <= top} | {top} | ({current} if current <= top else set())
    )


def _kv_options(model):
    spec = get_spec(model)
    return [(f"as published ({spec.n_kv_heads})", None)] + [
        (str(n), n) for n in kv_head_choices(spec)
    ]
