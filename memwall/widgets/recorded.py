"""Reference curves recorded from the answer key, so a student's widget draws data, not code.

A solution's widget cell calls ``compare_plot(student_fn, reference_fn, x=..., sliders=...)``
with a reference from the key. ``memwall notebooks`` runs those cells once (``record_curves``),
evaluates the reference on every value of ``x`` for a grid of slider settings (at most
``VALUES_PER_SLIDER`` per slider, the starting value among them) and writes the curves to
``memwall/widgets/curves/NN_slug.json`` (``recording.py``). The student copy's widget cell passes
``recorded_curves("<cell id>", "NN_slug")`` instead of the reference, and its sliders step through the
recorded settings. This module only reads the data: it is all a student's widget needs.
"""

import json
from pathlib import Path

CURVES_DIR = Path(__file__).resolve().parent / "curves"


class RecordedCurves:
    """The reference of one widget: y values along ``x`` for each recorded slider setting."""

    def __init__(self, data):
        self.x = (data["x"][0], data["x"][1])
        self.sliders = {name: list(values) for name, values in data["sliders"].items()}
        self.start = dict(data["start"])
        self.fixed = dict(data["fixed"])
        self._curves = {_key(setting): ys for setting, ys in data["curves"]}

    def __call__(self, **params):
        x_name, _ = self.x
        setting = [params[name] for name in self.sliders]
        ys = self._curves.get(_key(setting))
        if ys is None:
            raise ValueError("no recorded curve for these settings")
        return ys[list(self.x[1]).index(params[x_name])]


def recorded_curves(cell_id: str, notebook: str) -> RecordedCurves:
    """The recorded reference of the widget cell ``cell_id`` of ``notebook`` (``01_two_phases``:
    curves/01_two_phases.json)."""
    data = json.loads((CURVES_DIR / f"{notebook}.json").read_text())
    if cell_id not in data:
        raise LookupError(f"no recorded curves for widget {cell_id}: run `memwall notebooks`")
    return RecordedCurves(data[cell_id])


def _key(setting) -> str:
    return json.dumps([round(v, 9) if isinstance(v, float) else v for v in setting])
