"""Recording the reference curves of the solutions' widgets, for ``memwall notebooks``.

``record_curves(solution)`` runs a solution's import, exercise and widget cells with
``compare_plot`` replaced by a recorder that evaluates the key's reference along ``x`` for a
grid of slider settings (at most ``VALUES_PER_SLIDER`` per slider, the starting value among
them); ``student_widget_source`` points a student copy's widget cell at the recorded curves
(``recorded.py``). Needs the answer key: instructors and CI run it, students never do.
"""

import ast
import itertools
import math
import numbers

VALUES_PER_SLIDER = 5
# Fewer values per slider where a widget has many sliders: the file must stay small.
MAX_SETTINGS = 300
SIGNIFICANT_DIGITS = 7
# A value this small beside the widget's largest is floating-point rounding of a zero, and its
# digits differ between CPUs (they add a sum's terms in different orders): stored as 0, the file
# is the same on every machine. The widgets' real values span at most about 8 decades.
ROUNDING_NOISE = 1e-12


def _round(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(f"{float(value):.{SIGNIFICANT_DIGITS}g}")


def _zero_rounding_noise(curves) -> None:
    finite = [abs(v) for _, ys in curves for v in ys if v is not None and math.isfinite(v)]
    floor = ROUNDING_NOISE * max(finite, default=0.0)
    for _, ys in curves:
        ys[:] = [0.0 if v is not None and abs(v) < floor else v for v in ys]


def slider_values(spec, per_slider=VALUES_PER_SLIDER):
    """The recorded values of one slider spec (None for a value held fixed)."""
    if isinstance(spec, list):
        return list(spec)
    options = getattr(spec, "options", None)
    if options is not None:
        return [option[1] if isinstance(option, tuple) else option for option in options]
    if hasattr(spec, "value") and hasattr(spec, "min") and hasattr(spec, "max"):
        spec = (spec.min, spec.max, spec.step, spec.value)
    if (
        isinstance(spec, tuple)
        and len(spec) in (3, 4)
        and all(isinstance(v, numbers.Real) for v in spec)
    ):
        low, high, step = spec[:3]
        start = spec[3] if len(spec) == 4 else low
        count = int(round((high - low) / step)) + 1
        picks = {round(i * (count - 1) / (per_slider - 1)) for i in range(per_slider)}
        values = {low + pick * step for pick in picks} | {start}
        integral = all(isinstance(v, numbers.Integral) for v in spec)
        return sorted(int(v) if integral else round(float(v), 9) for v in values)
    return None


def _product(numbers_):
    total = 1
    for number in numbers_:
        total *= number
    return total


def _start(spec, values):
    if isinstance(spec, tuple) and len(spec) == 4:
        return spec[3]
    return getattr(spec, "value", values[0])


class Recorder:
    """Stands in for ``compare_plot`` while a solution's cells run: records the reference."""

    def __init__(self):
        self.cell_id, self.curves = None, {}

    def __call__(self, student_fn, reference_fn, x, sliders=None, **_):
        x_name, x_values = x[0], list(x[1])
        for per_slider in range(VALUES_PER_SLIDER, 1, -1):
            grids, fixed, start = {}, {}, {}
            for name, spec in (sliders or {}).items():
                values = slider_values(spec, per_slider)
                if values is None:
                    fixed[name] = spec
                else:
                    grids[name], start[name] = values, _start(spec, values)
            if _product(len(values) for values in grids.values()) <= MAX_SETTINGS:
                break
        curves = []
        for setting in itertools.product(*grids.values()):
            params = {**fixed, **dict(zip(grids, setting))}
            curves.append(
                [list(setting), [_round(reference_fn(**{x_name: v, **params})) for v in x_values]]
            )
        _zero_rounding_noise(curves)
        self.curves[self.cell_id] = {
            "x": [x_name, x_values], "sliders": grids, "start": start, "fixed": fixed,
            "curves": curves,
        }  # fmt: skip


def record_curves(nb) -> dict:
    """{widget cell id: recorded curves} for one solution notebook (needs the answer key).

    Runs the notebook's import, exercise and widget cells in one namespace, with compare_plot
    recording instead of drawing; other cells (measurements, displays) are skipped.
    """
    import memwall.machine as machine
    import memwall.widgets as widgets_package
    from memwall.widgets import exercise

    recorder, namespace = Recorder(), {"__name__": "__recording__"}
    original, original_measure = exercise.compare_plot, machine.measure
    widgets_package.compare_plot = exercise.compare_plot = recorder
    # The same file on every machine: "this machine" is the catalog's round-number laptop.
    machine.measure = _datasheet_measure
    try:
        for cell in nb.cells:
            source = cell.get("source", "")
            if cell.get("cell_type") != "code" or not _runs_while_recording(cell, source):
                continue
            recorder.cell_id = cell.get("id")
            try:
                exec(compile(source, f"<{cell.get('id')}>", "exec"), namespace)
            except ImportError:
                if _is_widget_or_exercise(cell, source):
                    raise  # a widget or exercise needs it; only a stray import may be skipped
    finally:
        widgets_package.compare_plot = exercise.compare_plot = original
        machine.measure = original_measure
    return recorder.curves


RECORDING_MACHINE = "laptop-100gbs"


class _DatasheetMeasurement:
    def __init__(self, machine):
        self.machine = machine
        self.bandwidth = machine.memory_bandwidth
        self.flops = dict(machine.peak_flops)

    def as_hardware(self):
        return self.machine


def _datasheet_measure(*args, **kwargs):
    from memwall.hardware import get_hardware

    return _DatasheetMeasurement(get_hardware(RECORDING_MACHINE))


def _runs_while_recording(cell, source) -> bool:
    memwall = cell.get("metadata", {}).get("memwall", {})
    if "check" in memwall or source.lstrip().startswith(("!", "%", "#Colab", "# Colab")):
        return False
    if _is_widget_or_exercise(cell, source):
        return True
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in tree.body)


def _is_widget_or_exercise(cell, source) -> bool:
    return "solution" in cell.get("metadata", {}).get("memwall", {}) or "compare_plot(" in source


def student_widget_source(source: str, cell_id: str, notebook: str) -> str:
    """A widget cell with its reference replaced by the recorded curves and no key import."""
    if "compare_plot(" not in source or "key_module" not in source:
        return source
    tree = ast.parse(source)
    replacements = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_plot":
            replacements.append(node.args[1])
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    text = source
    for arg in sorted(replacements, key=lambda a: (a.lineno, a.col_offset), reverse=True):
        start = offsets[arg.lineno - 1] + _byte_to_char(lines[arg.lineno - 1], arg.col_offset)
        end = offsets[arg.end_lineno - 1] + _byte_to_char(
            lines[arg.end_lineno - 1], arg.end_col_offset
        )
        text = text[:start] + "reference_curves" + text[end:]
    kept = [line for line in text.splitlines(keepends=True) if "key_module" not in line]
    header = (
        "from memwall.widgets.recorded import recorded_curves\n\n"
        f'reference_curves = recorded_curves("{cell_id}", "{notebook}")\n'
    )
    return header + "".join(kept).lstrip("\n")


def _byte_to_char(line: str, byte_offset: int) -> int:
    return len(line.encode()[:byte_offset].decode(errors="ignore"))
