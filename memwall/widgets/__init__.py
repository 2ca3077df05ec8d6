"""Interactive widgets (ipywidgets) for the book's calculators and exercises."""

from memwall.widgets.exercise import compare_plot
from memwall.widgets.calculator import cache_calculator
