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


# --- measured exercises: the student's method run on a real bench, and what the panel draws ---

from memwall.widgets import measured, measured_views  # noqa: E402


def median_ratio(bench, repeats):
    ratios = []
    for _ in range(repeats):
        start = bench.clock()
        bench.run_a()
        middle = bench.clock()
        bench.run_b()
        ratios.append((bench.clock() - middle) / (middle - start))
    return sorted(ratios)[len(ratios) // 2]


def test_run_recorded_logs_each_call_and_returns_the_result():
    result, calls, problem = measured.run_recorded(median_ratio, measured.RealAB(), repeats=3)
    assert problem is None and result > 0
    assert [name for name, *_ in calls] == ["run_a", "run_b"] * 3
    assert all(seconds > 0 for *_, seconds in calls)


def test_an_unfinished_or_broken_method_is_shown_not_raised():
    def unfinished_method(bench, repeats):
        raise NotImplementedError

    def broken_method(bench, repeats):
        bench.run_a()
        return 1 / 0

    assert (
        measured.run_recorded(unfinished_method, measured.RealAB(), repeats=1)[2] == NOT_IMPLEMENTED
    )
    result, calls, problem = measured.run_recorded(broken_method, measured.RealAB(), repeats=1)
    assert "ZeroDivisionError" in problem and len(calls) == 1


def test_the_cache_panel_draws_reads_and_both_lines():
    import matplotlib.pyplot as plt

    def one_size(bench, sizes, repeats):
        for size in sizes:
            bench.read(size)
        return sizes[0]

    result, calls, _ = measured.run_recorded(
        one_size, measured.RealCacheSweep(), sizes=[4096, 8192], repeats=1
    )
    figure, axes = plt.subplots()
    measured_views.cache_sweep(2**20)(axes, calls, result)
    assert len(axes.lines) == 3  # the reads, your cliff, the LLC
    plt.close(figure)


def test_measured_panel_builds_headless_and_shows_not_implemented():
    def unfinished_method(bench, repeats):
        raise NotImplementedError

    panel = measured.measured_panel(
        unfinished_method, measured.RealAB, measured_views.ab_timeline, repeats=2
    )
    assert isinstance(panel, widgets.VBox)
    panel.children[0].click()  # measuring again must not raise either


def test_recorded_curves_store_a_rounded_zero_as_zero_and_keep_real_small_values():
    from memwall.widgets.recording import Recorder

    recorder = Recorder()
    recorder.cell_id = "c"

    def reference(n, similarity):  # an error that is exactly 0 at similarity 1, but for rounding
        return (1 - similarity) * 0.9 + (4e-16 if similarity == 1.0 else 0.0) + 3e-8 * n

    recorder(None, reference, ("n", [0, 1]), sliders={"similarity": [0.5, 1.0]})
    curves = dict((tuple(s), ys) for s, ys in recorder.curves["c"]["curves"])
    assert curves[(1.0,)] == [0.0, 3e-8]
    assert curves[(0.5,)] == [0.45, 0.45]  # 7 significant digits
