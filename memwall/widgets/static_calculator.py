"""The calculator as one self-contained block of HTML + JavaScript, for pages without a kernel.

ipywidgets need a running Python to compute anything, so on the static book site the widget
version of the calculator would be a picture. `html()` returns a <div> with its own controls, the
model and hardware catalogs embedded as JSON, and the arithmetic of `memwall.cost` ported to
JavaScript (`calculator_core.js`). It needs no network and no kernel: in a notebook,
`IPython.display.HTML(html())` puts it in the cell's output, and the book build copies that output
into the page, where the browser runs it.

tests/test_calculator.py runs the embedded JavaScript under node over a grid of inputs and checks
every figure against `memwall.cost.calc` and every displayed string against `calculator.displayed`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from importlib import resources

from memwall import cost
from memwall.hardware import CATALOG as HARDWARE
from memwall.specs import CATALOG as MODELS
from memwall.widgets import calculator

CORE_FILE, UI_FILE = "calculator_core.js", "calculator_ui.js"
CORE_BEGIN, CORE_END = "/* memwall calculator core: begin */", "/* memwall calculator core: end */"


def catalog() -> dict:
    """What the JavaScript needs from Python: the catalogs and the dtype table, as plain data."""
    return {
        "models": {name: dataclasses.asdict(spec) for name, spec in MODELS.items()},
        "hardware": {
            name: {
                "name": hw.name,
                "memory_bandwidth": hw.memory_bandwidth,
                "peak_flops": dict(hw.peak_flops),
                "memory_bytes": hw.memory_bytes,
                "note": hw.note,
            }
            for name, hw in HARDWARE.items()
        },
        "dtype_bytes": dict(cost.DTYPE_BYTES),
        "grouped_bases": list(cost.GROUPED_BASES),
        "group_metadata_bytes": cost.GROUP_METADATA_BYTES,
        "float_compute_dtypes": list(cost.FLOAT_COMPUTE_DTYPES),
    }


def core_js() -> str:
    """The arithmetic (no DOM): defines `MemwallCalc.figures(catalog, inputs)` and `.displayed(figures)`."""
    return _read(CORE_FILE)


def ui_config(**overrides) -> dict:
    start = {**calculator.DEFAULTS, **overrides}
    unknown = set(start) - set(calculator.DEFAULTS)
    if unknown:
        raise ValueError(
            f"Unknown calculator inputs {sorted(unknown)}; choose from {', '.join(calculator.DEFAULTS)}."
        )
    calculator.figures(
        **start
    )  # the starting inputs must be valid: raises a ValueError naming the choices
    return {
        "catalog": catalog(),
        "defaults": start,
        "weight_dtypes": calculator.WEIGHT_DTYPES,
        "kv_dtypes": [[label, value] for label, value in calculator.KV_DTYPES],
        "rows": [list(row) for row in calculator.RESULT_ROWS],
        "colors": calculator.COLORS,
    }


def html(element_id: str | None = None, **overrides) -> str:
    """The calculator as an HTML fragment; keyword arguments set the starting inputs (see calculator.DEFAULTS)."""
    element_id = element_id or f"memwall-calc-{uuid.uuid4().hex[:8]}"
    config = json.dumps(ui_config(**overrides), separators=(",", ":"))
    # "</" would end the <script> element early if it ever appeared inside the JSON.
    config = config.replace("</", "<\\/")
    return (
        f"{calculator.STYLE}\n<style>#{element_id} .mw-field{{margin-right:10px;white-space:nowrap}}"
        f"#{element_id} .mw-controls{{display:flex;flex-wrap:wrap;gap:4px;margin-bottom:4px}}</style>\n"
        f'<div id="{element_id}" class="mw-calc"><noscript>This calculator needs JavaScript.</noscript></div>\n'
        f"<script>\n{CORE_BEGIN}\n{core_js()}\n{CORE_END}\n{_read(UI_FILE)}\n"
        f'memwallCalculatorUI(document.getElementById("{element_id}"), {config});\n</script>\n'
    )


def extract_core(page: str) -> str:
    """The core JavaScript as embedded in a page made by `html()` (what the tests run)."""
    start, end = page.index(CORE_BEGIN) + len(CORE_BEGIN), page.index(CORE_END)
    return page[start:end]


def extract_config(page: str) -> dict:
    """The JSON config embedded in a page made by `html()`."""
    call = page.rindex("memwallCalculatorUI(")
    start, end = page.index("{", call), page.rindex(");\n</script>")
    return json.loads(page[start:end].replace("<\\/", "</"))


def _read(name: str) -> str:
    return resources.files("memwall.widgets").joinpath(name).read_text(encoding="utf-8")
