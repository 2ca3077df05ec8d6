"""Interactive widgets (ipywidgets) for the book's calculators and exercises."""

from memwall.widgets.exercise import compare_plot
