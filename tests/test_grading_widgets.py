"""compare_plot: the widget every exercise uses, run headless as nbval and the book build do."""

import ipywidgets as widgets
import matplotlib
import pytest

matplotlib.use("Agg")

from memwall.widgets import compare_plot  # noqa: E402
from memwall.widgets.exercise import NOT_IMPLEMENTED, comparison_figure, make_control  # noqa: E402


def reference(tokens, bytes_per_token):
    return tokens * bytes_per_token


def unfinished(tokens, bytes_per_token):
    raise NotImplementedError("Exercise 1: multiply")


def texts(figure):
    return [text.get_text() for text in figure.axes[0].texts]


def test_figure_draws_both_curves():
    figure = comparison_figure(reference, reference, ("tokens", [1, 2, 4]), {"bytes_per_token": 2})
    assert len(figure.axes[0].lines) == 2 and texts(figure) == []
    assert list(figure.axes[0].lines[1].get_ydata()) == [2, 4, 8]


def test_unfinished_function_shows_not_implemented_instead_of_crashing():
    figure = comparison_figure(unfinished, reference, ("tokens", [1, 2]), {"bytes_per_token": 2})
    assert len(figure.axes[0].lines) == 1 and texts(figure) == [NOT_IMPLEMENTED]


@pytest.mark.parametrize(
    "student, shown",
    [(lambda tokens, bytes_per_token: 1 / 0, "raised ZeroDivisionError"),
     (lambda tokens, bytes_per_token: "many", "returned str, not a number")],
)  # fmt: skip
def test_other_student_errors_are_shown_in_the_plot(student, shown):
    figure = comparison_figure(student, reference, ("tokens", [1, 2]), {"bytes_per_token": 2})
    assert shown in texts(figure)[0]


def test_slider_specs_become_the_right_controls():
    assert isinstance(make_control("layers", (1, 80, 1, 32)), widgets.IntSlider)
    assert isinstance(make_control("gb_s", (10.0, 3350.0, 10.0)), widgets.FloatSlider)
    assert isinstance(make_control("bytes", [2, 1, 4]), widgets.Dropdown)
    assert make_control("fixed", 7) is None
    ready = widgets.IntSlider()
    assert make_control("mine", ready) is ready


def test_compare_plot_builds_and_redraws_headless():
    panel = compare_plot(unfinished, reference, x=("tokens", [1, 10, 100]), sliders={"bytes_per_token": (1, 8, 1, 2)},
                         title="KV bytes", logx=True)  # fmt: skip
    assert isinstance(panel, widgets.VBox)
    (slider,) = panel.children[0].children
    slider.value = 4  # moving the slider redraws; it must not raise either
