"""The cache calculator: the static page's JavaScript (run under node) must show exactly what
memwall.cost computes, over a grid of inputs; the ipywidgets version too."""

import itertools
import json
import math
import random
import re
import shutil
import subprocess

import pytest

from memwall import cost
from memwall.hardware import CATALOG as HARDWARE
from memwall.specs import CATALOG as MODELS
from memwall.widgets import calculator, static_calculator

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None, reason="needs node to run the page's JavaScript"
)

RTOL = 1e-9
PAGE = static_calculator.html(element_id="calc-under-test")

# A minimal DOM: enough for calculator_ui.js to build its controls and table under node.
FAKE_DOM = r"""
class FakeElement {
  constructor(tag) { this.tagName = tag; this.children = []; this.attributes = {}; this.listeners = {}; this.ownText = ""; this.value = ""; }
  setAttribute(key, value) { this.attributes[key] = String(value); if (key === "value") this.value = String(value); }
  appendChild(child) {
    this.children.push(child);
    if (this.tagName === "select" && child.tagName === "option" && this.children.length === 1) this.value = child.attributes.value;
    return child;
  }
  set textContent(text) { this.ownText = String(text); this.children = []; }
  get textContent() { return this.ownText + this.children.map(c => c.textContent).join(""); }
  set innerHTML(text) { if (text !== "") throw new Error("the fake DOM only clears innerHTML"); this.children = []; this.ownText = ""; }
  addEventListener(event, listener) { (this.listeners[event] = this.listeners[event] || []).push(listener); }
  fire(event) { (this.listeners[event] || []).forEach(listener => listener()); }
  findAll(predicate, found = []) { if (predicate(this)) found.push(this); this.children.forEach(c => c.findAll && c.findAll(predicate, found)); return found; }
}
const fakeRoot = new FakeElement("div");
const document = {
  getElementById: () => fakeRoot,
  createElement: tag => new FakeElement(tag),
  createTextNode: text => ({ textContent: String(text) }),
};
"""

HARNESS = r"""
const request = JSON.parse(require("fs").readFileSync(0, "utf8"));
const config = request.config;
const grid = request.cases.map(inputs => {
  try { const f = MemwallCalc.figures(config.catalog, inputs); return { figures: f, displayed: MemwallCalc.displayed(f) }; }
  catch (error) { return { error: error.message }; }
});
// The page itself: controls in order model, GPU, weights, KV dtype, context, slider, users, slider, KV heads.
const controls = fakeRoot.children[0].children.map(label => label.children[0]);
const [model, gpu, dtype, kvDtype, context, contextSlider, users, usersSlider, kvHeads] = controls;
function shown() {
  const cells = fakeRoot.findAll(e => e.attributes && e.attributes["data-key"] !== undefined);
  const text = {}; cells.forEach(cell => { text[cell.attributes["data-key"]] = cell.textContent; });
  const error = fakeRoot.findAll(e => e.attributes && e.attributes["class"] === "mw-error");
  return { text, error: error.length ? error[0].textContent : null,
           state: { model: model.value, hardware: gpu.value, dtype: dtype.value, kv_dtype: kvDtype.value,
                    context: context.value, batch: users.value, kv_heads: kvHeads.value } };
}
const byName = { model, gpu, dtype, kvDtype, context, contextSlider, users, usersSlider, kvHeads };
const page = [shown()];
request.interactions.forEach(([name, value, event]) => { byName[name].value = value; byName[name].fire(event); page.push(shown()); });
console.log(JSON.stringify({ grid, page }));
"""

INTERACTIONS = [
    ("gpu", "a100-40gb", "change"),
    ("dtype", "int4-g128", "change"),
    ("kvDtype", "fp8", "change"),
    ("kvHeads", "1", "change"),
    ("users", "300", "input"),
    ("contextSlider", "15", "input"),
    ("model", "gpt2", "change"),  # context clamps to 1024, KV heads back to "as published"
    ("model", "llama-2-70b", "change"),
    ("kvHeads", "64", "change"),
    ("context", "4096", "input"),
    ("gpu", "l4", "change"),  # 140 GB of weights do not fit in 24 GB
    ("model", "mixtral-8x7b", "change"),
    ("gpu", "h200", "change"),
    ("usersSlider", "6", "input"),
    ("context", "40000", "input"),  # beyond Mixtral's 32768: the page shows the error
]


def script_of(page: str) -> str:
    return page[page.index("<script>") + len("<script>") : page.rindex("</script>")]


def run_page(cases, interactions=()):
    source = FAKE_DOM + script_of(PAGE) + HARNESS
    request = json.dumps(
        {
            "config": static_calculator.extract_config(PAGE),
            "cases": cases,
            "interactions": list(interactions),
        }
    )
    done = subprocess.run(
        ["node", "-e", source], input=request, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def python_result(inputs):
    try:
        f = calculator.figures(**inputs)
        return {"figures": f, "displayed": calculator.displayed(f)}
    except ValueError as error:
        return {"error": str(error)}


def grid_cases():
    """Every model on every GPU at defaults, then a seeded random sweep over all the inputs."""
    cases = [
        dict(
            model=m,
            hardware=h,
            dtype="bf16",
            kv_dtype=None,
            context=min(4096, MODELS[m].max_context),
            batch=8,
            kv_heads=None,
        )
        for m, h in itertools.product(MODELS, HARDWARE)
    ]
    rng = random.Random(5)
    kv_dtypes = [value for _, value in calculator.KV_DTYPES]
    for _ in range(1500):
        model = rng.choice(list(MODELS))
        spec = MODELS[model]
        cases.append(
            dict(
                model=model,
                hardware=rng.choice(list(HARDWARE)),
                dtype=rng.choice(calculator.WEIGHT_DTYPES),
                kv_dtype=rng.choice(kv_dtypes),
                context=rng.randint(1, spec.max_context),
                batch=rng.choice([1, 2, 7, 16, 64, 256, 1000, rng.randint(1, 5000)]),
                kv_heads=rng.choice([None, *calculator.kv_head_choices(model)]),
            )
        )
    # the worked numbers of DESIGN.md, and inputs both sides must refuse
    cases += [
        dict(
            model="llama-3-8b",
            hardware="h100-sxm",
            dtype="bf16",
            kv_dtype=None,
            context=1,
            batch=1,
            kv_heads=None,
        ),
        dict(
            model="llama-3.2-1b",
            hardware="laptop-100gbs",
            dtype="int4",
            kv_dtype=None,
            context=8192,
            batch=16,
            kv_heads=None,
        ),
        dict(
            model="gpt2",
            hardware="t4",
            dtype="bf16",
            kv_dtype=None,
            context=1025,
            batch=1,
            kv_heads=None,
        ),
        dict(
            model="llama-3-8b",
            hardware="h100-sxm",
            dtype="int3",
            kv_dtype=None,
            context=10,
            batch=1,
            kv_heads=None,
        ),
        dict(
            model="llama-3-8b",
            hardware="h100-sxm",
            dtype="bf16",
            kv_dtype=None,
            context=10,
            batch=1,
            kv_heads=5,
        ),
        dict(
            model="llama-3-8b",
            hardware="h100-sxm",
            dtype="bf16",
            kv_dtype=None,
            context=0,
            batch=1,
            kv_heads=None,
        ),
        dict(
            model="llama-3-8b",
            hardware="tpu",
            dtype="bf16",
            kv_dtype=None,
            context=10,
            batch=1,
            kv_heads=None,
        ),
    ]
    return cases


def assert_same(expected, got, where):
    assert set(got) == set(expected), f"{where}: keys differ: {set(got) ^ set(expected)}"
    for key, want in expected.items():
        have = got[key]
        if isinstance(want, bool) or isinstance(want, str):
            assert have == want, f"{where}: {key} is {have!r} in JS, {want!r} in Python"
        else:
            assert math.isclose(have, want, rel_tol=RTOL), (
                f"{where}: {key} is {have!r} in JS, {want!r} in Python"
            )


@pytest.fixture(scope="module")
def grid_run():
    cases = grid_cases()
    return cases, run_page(cases, INTERACTIONS)


def test_every_figure_and_every_displayed_string_matches_python(grid_run):
    cases, result = grid_run
    errors = 0
    for inputs, js in zip(cases, result["grid"]):
        py = python_result(inputs)
        if "error" in py:
            errors += 1
            assert "error" in js, (
                f"{inputs}: Python refused ({py['error']}) but the page computed {js}"
            )
            continue
        assert "error" not in js, f"{inputs}: the page failed with {js['error']}"
        assert_same(py["figures"], js["figures"], inputs)
        assert js["displayed"] == py["displayed"], inputs
    assert errors == 5 and len(cases) > 1600


def test_the_figures_are_memwall_cost_calc(grid_run):
    """The calculator adds to cost.calc's dict, never changes it."""
    for inputs in grid_run[0][:40]:
        f = calculator.figures(**inputs)
        assert {key: f[key] for key in cost.calc("gpt2", "t4")} == cost.calc(
            **{
                "model": inputs["model"],
                "hardware": inputs["hardware"],
                "dtype": inputs["dtype"],
                "kv_dtype": inputs["kv_dtype"],
                "context": inputs["context"],
                "batch": inputs["batch"],
                "kv_heads": inputs["kv_heads"],
            }
        )


def test_worked_numbers_appear_on_the_page(grid_run):
    cases, result = grid_run
    first = result["grid"][-7]  # llama-3-8b, h100, bf16, one token
    assert first["figures"]["weight_storage_bytes"] == pytest.approx(16.06e9, rel=1e-3)
    assert first["figures"]["tokens_per_s_per_user"] == pytest.approx(
        208.6, rel=1e-3
    )  # DESIGN: about 210
    assert first["displayed"]["kv_per_token"] == "128 KiB"
    laptop = result["grid"][-6]  # Llama 3.2 1B: 16 layers, 8 KV heads, head dim 64
    assert laptop["displayed"]["kv_per_token"] == "32.0 KiB"


def test_the_page_shows_what_python_computes_after_each_interaction(grid_run):
    pages = grid_run[1]["page"]
    assert len(pages) == len(INTERACTIONS) + 1
    for number, page in enumerate(pages):
        state = page["state"]
        inputs = dict(
            model=state["model"],
            hardware=state["hardware"],
            dtype=state["dtype"],
            kv_dtype=state["kv_dtype"] or None,
            context=int(state["context"]),
            batch=int(state["batch"]),
            kv_heads=int(state["kv_heads"]) if state["kv_heads"] else None,
        )
        py = python_result(inputs)
        if "error" in py:
            assert page["error"] == py["error"] and page["text"] == {}, (number, page)
        else:
            assert page["error"] is None and page["text"] == py["displayed"], (number, inputs)
    states = [page["state"] for page in pages]
    assert states[0]["model"] == calculator.DEFAULTS["model"] and states[0]["context"] == "8192"
    assert states[6]["context"] == "32768"  # slider at 2^15
    assert (
        states[7]["context"] == "1024" and states[7]["kv_heads"] == ""
    )  # gpt2 clamps, heads reset
    assert (
        pages[11]["text"]["free"].startswith("short by") and pages[11]["text"]["max_users"] == "0"
    )
    assert "exceeds mixtral-8x7b's maximum of 32768" in pages[-1]["error"]


def test_the_page_is_self_contained():
    assert "<script src" not in PAGE and "://" not in PAGE and "@import" not in PAGE
    assert static_calculator.extract_config(PAGE)["catalog"]["models"].keys() == MODELS.keys()
    assert "function figures" in static_calculator.extract_core(PAGE)
    other = static_calculator.html()
    assert re.search(r'id="memwall-calc-[0-9a-f]{8}"', other)
    with pytest.raises(ValueError, match="choose from"):
        static_calculator.html(model="llama-5")
    with pytest.raises(ValueError, match="Unknown calculator inputs"):
        static_calculator.html(users=3)


# ---- the ipywidgets version ---------------------------------------------------------------------------


def widget_parts(widget):
    rows = widget.children
    model, gpu = rows[0].children
    dtype, kv_dtype = rows[1].children
    context, users = rows[2].children
    return dict(
        model=model,
        gpu=gpu,
        dtype=dtype,
        kv_dtype=kv_dtype,
        context=context,
        users=users,
        kv_heads=rows[3],
        output=rows[4],
    )


def assert_widget_shows(parts, **inputs):
    text = calculator.displayed(calculator.figures(**inputs))
    shown = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", parts["output"].value))
    import html

    assert {label: html.unescape(value) for label, value in shown.items()} == {
        label: text[key] for label, key in calculator.RESULT_ROWS
    }


def test_widget_shows_the_python_figures_and_follows_its_controls():
    from memwall.widgets import cache_calculator

    parts = widget_parts(cache_calculator())
    assert_widget_shows(parts, **calculator.DEFAULTS)
    parts["kv_heads"].value = 1
    parts["users"].value = 64
    assert_widget_shows(parts, **{**calculator.DEFAULTS, "kv_heads": 1, "batch": 64})
    parts["model"].value = "gpt2"  # context clamps to 1024; 1 KV head is not a gpt2 choice
    assert parts["context"].value == 1024 and parts["kv_heads"].value is None
    assert_widget_shows(
        parts, **{**calculator.DEFAULTS, "model": "gpt2", "context": 1024, "batch": 64}
    )
    parts["model"].value = "llama-2-70b"
    parts["gpu"].value = "l4"
    parts["dtype"].value = "int4-g128"
    parts["kv_dtype"].value = "fp8"
    assert_widget_shows(
        parts,
        model="llama-2-70b",
        hardware="l4",
        dtype="int4-g128",
        kv_dtype="fp8",
        context=1024,
        batch=64,
        kv_heads=None,
    )
    assert "short by" in parts["output"].value and 'class="mw-limit"' in parts["output"].value


def test_widget_rejects_unknown_inputs():
    from memwall.widgets import cache_calculator

    with pytest.raises(ValueError, match="Unknown calculator inputs"):
        cache_calculator(users=2)


def test_formatting_rounds_half_up_and_groups_thousands():
    assert calculator.format_number(0.125) == "0.125"
    assert calculator.format_number(2.675) in (
        "2.67",
        "2.68",
    )  # binary 2.675 is just below; JS agrees (grid)
    assert calculator.format_number(1234.5) == "1,235"
    assert calculator.format_bytes(80e9) == "80.0 GB" and calculator.format_bytes(512) == "512 B"
    assert calculator.format_bytes(0) == "0 B"
    assert calculator.kv_head_choices("smollm2-135m") == [1, 3, 9] and calculator.kv_head_choices(
        "gpt2"
    ) == [12]
