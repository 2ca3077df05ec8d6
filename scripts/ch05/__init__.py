"""Cells of chapter 5 (GQA/MQA) and its exercises, written by scripts/make_ch05.py."""
