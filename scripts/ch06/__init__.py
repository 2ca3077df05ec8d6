"""Cells of chapter 6 (batching) and its exercises, written by scripts/make_ch06.py."""
