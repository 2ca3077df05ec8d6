"""memwall: measure why LLM inference is bound by bytes, not FLOPs.

Imports flow one way: specs, hardware -> cost -> engine -> bench -> plots, widgets, grading, cli.
Heavy modules (torch, transformers) are imported lazily by the modules that need them.
"""

__version__ = "0.1.0"

# Before torch loads OpenMP: idle threads spin briefly, then sleep, so that a process beside
# memwall's does not make its threads wait for every turn (machine/cores.py; chapter 9).
from memwall.machine.cores import spin_briefly  # noqa: E402

spin_briefly()
