"""``compare_plot``: sliders, and the student's function drawn next to the reference.

Every exercise is driven by a widget. The reader moves sliders and sees their function plotted
over memwall's. An unfinished exercise (``NotImplementedError``) shows "not implemented yet" where
its curve would be, and any other error is printed in the plot too, so the cell never crashes,
headless runs (nbval, the book build) included. ipywidgets and matplotlib are imported only
when a plot is made.
"""

import numbers

NOT_IMPLEMENTED = "not implemented yet"


def compare_plot(student_fn, reference_fn, x, sliders=None, title=None, xlabel=None, ylabel=None,
                 logx=False, logy=False):  # fmt: skip
    """Sliders for the parameters, and a plot of both functions along ``x``.

    ``x`` is ``(name, values)``: the argument swept along the horizontal axis. Each function is
    called as ``fn(**{name: value, **slider_values})`` for every value and must return a number.
    ``sliders`` maps the other argument names to ``(min, max, step[, value])`` for a slider, a
    list of choices for a dropdown, a ready-made ipywidget, or a plain value to hold fixed.
    Returns the widget (a cell ending with it displays it). In a student's copy the reference
    is ``recorded_curves(...)`` (recorded.py): the sliders then step through its settings.
    """
    import ipywidgets as widgets

    from memwall.widgets.recorded import RecordedCurves

    if isinstance(reference_fn, RecordedCurves):
        x, sliders = reference_fn.x, recorded_sliders(reference_fn)

    controls, fixed = {}, {}
    for name, spec in (sliders or {}).items():
        control = make_control(name, spec)
        if control is None:
            fixed[name] = spec
        else:
            controls[name] = control

    def redraw(**values):
        import matplotlib.pyplot as plt
        from IPython.display import display

        figure = comparison_figure(student_fn, reference_fn, x, {**fixed, **values}, title=title,
                                   xlabel=xlabel, ylabel=ylabel, logx=logx, logy=logy)  # fmt: skip
        display(figure)
        plt.close(figure)  # displayed once, by us, not again by the inline backend

    output = widgets.interactive_output(redraw, controls)
    return widgets.VBox(
        [widgets.HBox(list(controls.values())) if controls else widgets.HBox(), output]
    )


def recorded_sliders(curves) -> dict:
    """Sliders that step through the settings the reference was recorded at."""
    import ipywidgets as widgets

    sliders = dict(curves.fixed)
    for name, values in curves.sliders.items():
        sliders[name] = widgets.SelectionSlider(
            options=values, value=curves.start.get(name, values[0]), description=name,
            continuous_update=False,
        )  # fmt: skip
    return sliders


def make_control(name, spec):
    """An ipywidget for one slider spec, or None for a value held fixed."""
    import ipywidgets as widgets

    if isinstance(spec, widgets.ValueWidget):
        return spec
    if isinstance(spec, list):
        return widgets.Dropdown(options=spec, value=spec[0], description=name)
    if (
        isinstance(spec, tuple)
        and len(spec) in (3, 4)
        and all(isinstance(v, numbers.Real) for v in spec)
    ):
        low, high, step = spec[:3]
        value = spec[3] if len(spec) == 4 else low
        kind = (
            widgets.IntSlider
            if all(isinstance(v, numbers.Integral) for v in spec)
            else widgets.FloatSlider
        )
        return kind(
            min=low, max=high, step=step, value=value, description=name, continuous_update=False
        )
    return None


def comparison_figure(student_fn, reference_fn, x, params, title=None, xlabel=None, ylabel=None,
                      logx=False, logy=False):  # fmt: skip
    """A matplotlib Figure with the reference curve and the student's curve (or why it is missing)."""
    import matplotlib.pyplot as plt

    x_name, x_values = x
    x_values = list(x_values)
    figure, axes = plt.subplots(figsize=(6.4, 3.6))
    reference = [reference_fn(**{x_name: value, **params}) for value in x_values]
    axes.plot(x_values, reference, "--", color="gray", linewidth=2, label="reference")
    yours, problem = evaluate_student(student_fn, x_name, x_values, params)
    if problem is None:
        axes.plot(x_values, yours, color="C0", label="yours")
    else:
        axes.text(0.5, 0.5, problem, transform=axes.transAxes, ha="center", va="center",
                  color="C3", fontsize=12, wrap=True)  # fmt: skip
    axes.set_xscale("log" if logx else "linear")
    axes.set_yscale("log" if logy else "linear")
    axes.set_xlabel(xlabel or x_name)
    axes.set_ylabel(ylabel or "")
    axes.set_title(title or "")
    axes.legend(loc="best")
    figure.tight_layout()
    return figure


def evaluate_student(student_fn, x_name, x_values, params):
    """(values, None), or (None, a short reason to show instead of the curve)."""
    try:
        values = [student_fn(**{x_name: value, **params}) for value in x_values]
    except NotImplementedError:
        return None, NOT_IMPLEMENTED
    except Exception as error:  # a student's bug belongs in the plot, not in a traceback
        return None, f"your function raised {type(error).__name__}: {error}"[:120]
    if not all(isinstance(value, numbers.Real) for value in values):
        bad = next(value for value in values if not isinstance(value, numbers.Real))
        return None, f"your function returned {type(bad).__name__}, not a number"
    return values, None
