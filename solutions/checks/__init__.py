"""One module per chapter with that chapter's checks: ``ch01.py`` registers ``ch01.*``.

A check named ``"ch01.ttft"`` is found by importing ``memwall.grading.checks.ch01``; see
``demo.py`` for a complete, commented example. Import torch, transformers or memwall's heavy
modules inside the check functions, never at module level, so a check cell stays fast.
"""
