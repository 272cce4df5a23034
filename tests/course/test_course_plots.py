"""dpteach.course.plots.lines: equal lines drawn once under a label naming them all; dots always drawn."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dpteach.course import plots  # noqa: E402


def _labels(series, styles):
    fig, ax = plt.subplots()
    plots.lines(ax, series, styles)
    labels = [line.get_label() for line in ax.get_lines()]
    plt.close(fig)
    return labels


def test_equal_lines_are_one_line_and_the_label_says_so():
    series = {"a": [1.0, 2.0], "b": [0.0, 0.0], "c": [0.0, 0.0], "d": [1.0, 2.0]}
    styles = {"a": "-", "b": "--", "c": ":", "d": "-."}
    assert _labels(series, styles) == ["a, d (same line)", "b, c (same line at 0)"]


def test_different_lines_and_dots_are_all_drawn():
    series = {"a": [1.0, 2.0], "b": [1.0, 2.5], "dots": [1.0, 2.0]}
    assert _labels(series, {"a": "-", "b": "--", "dots": "none"}) == ["a", "b", "dots"]
