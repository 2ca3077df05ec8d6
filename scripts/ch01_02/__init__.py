"""Sources of chapters 1-2 and their solution notebooks; `scripts/make_ch01_02.py` writes them."""
