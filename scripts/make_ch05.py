"""Write chapter 5 and its solutions notebook:  .venv/bin/python scripts/make_ch05.py  (then `memwall exercises`)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import notebook, write  # noqa: E402
from ch05 import chapter_measure, chapter_theory, solutions  # noqa: E402


def main():
    write(notebook("05_gqa", chapter_theory.cells() + chapter_measure.cells()), ROOT / "chapters/05_gqa.ipynb")
    write(solutions.build(), ROOT / "solutions/05_gqa.ipynb")


if __name__ == "__main__":
    main()
