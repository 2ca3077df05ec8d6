"""Write chapter 9 and its solutions notebook:  .venv/bin/python scripts/make_ch09.py  (then `memwall exercises`)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import notebook, write  # noqa: E402
from ch09 import chapter09, chapter09_rest, roofline_table, solutions09  # noqa: E402


def main():
    cells = chapter09.cells() + roofline_table.cells() + chapter09_rest.serving_cells() + chapter09_rest.open_question_cells()
    write(notebook("09_measuring", cells), ROOT / "chapters/09_measuring.ipynb")
    write(solutions09.build(), ROOT / "solutions/09_measuring.ipynb")


if __name__ == "__main__":
    main()
