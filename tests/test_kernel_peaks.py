"""The book build's per-chapter memory records (tests/book_build.py), which the Binder memory test
in tests/test_book.py judges: a kernel's peak must reach the record and name its chapter."""

import os
import sys

import nbclient
import nbformat
import pytest
from book_build import chapter_peaks, kernel_peak_env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")

BIG = 300_000_000  # bytes one chapter touches, far above what a kernel starts with


def _notebook(*sources):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])


def test_a_kernels_peak_is_recorded_under_its_chapter(tmp_path, monkeypatch):
    (tmp_path / "chapters").mkdir()
    small = _notebook("import math", "small = [math.pi] * 10")
    big = _notebook("import math", f"big = bytearray({BIG})", "del big")
    nbformat.write(small, str(tmp_path / "chapters" / "01_small.ipynb"))
    nbformat.write(big, str(tmp_path / "chapters" / "02_big.ipynb"))
    for name, value in kernel_peak_env(tmp_path / "_build").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    for notebook in (small, big):
        nbclient.NotebookClient(notebook, kernel_name="python3", timeout=120).execute()
    # the hook leaves the chapters' outputs and namespace alone
    assert not any(cell.outputs for notebook in (small, big) for cell in notebook.cells)

    peaks = chapter_peaks(tmp_path / "_build", tmp_path)
    assert set(peaks) == {"01_small", "02_big"}
    assert peaks["02_big"] > BIG > peaks["01_small"]  # the peak outlives the `del`
