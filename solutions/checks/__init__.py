"""The answer key: one module per chapter with that chapter's checks (``ch01.py`` registers
``ch01.*``), their references and wrong answers. It stays beside ``solutions/`` with the
instructor and never ships in the package (``memwall.grading.answer_key`` loads it).

A check named ``"ch01.ttft"`` is found by importing ``ch01.py`` from here; see ``demo.py`` for a
complete, commented example. Import torch, transformers or memwall's heavy modules inside the
check functions, never at module level, so a check cell stays fast.
"""
