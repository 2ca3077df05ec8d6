"""Cells of chapter 8 (speculative decoding) and its exercises, written by scripts/make_ch08.py."""
