"""Write chapter 8 and its solutions notebook:  .venv/bin/python scripts/make_ch08.py  (then `memwall exercises`)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import notebook, write  # noqa: E402
from ch08 import chapter, solutions  # noqa: E402


def main():
    write(notebook("08_speculative", chapter.cells()), ROOT / "chapters/08_speculative.ipynb")
    write(solutions.build(), ROOT / "solutions/08_speculative.ipynb")


if __name__ == "__main__":
    main()
