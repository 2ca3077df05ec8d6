"""Interactive widgets (ipywidgets) for the book's calculators and exercises."""

from memwall.widgets.calculator import cache_calculator
from memwall.widgets.exercise import compare_plot

__all__ = ["cache_calculator", "compare_plot"]
