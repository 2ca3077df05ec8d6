"""memwall: measure why LLM inference is bound by bytes, not FLOPs.

Imports flow one way: specs, hardware -> cost -> engine -> bench -> plots, widgets, grading, cli.
Heavy modules (torch, transformers) are imported lazily by the modules that need them.
"""

__version__ = "0.1.0"
