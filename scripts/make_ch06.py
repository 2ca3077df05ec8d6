"""Write chapter 6 and its solutions notebook:  .venv/bin/python scripts/make_ch06.py  (then `memwall exercises`)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import notebook, write  # noqa: E402
from ch06 import chapter, solutions  # noqa: E402


def main():
    write(notebook("06_batching", chapter.cells()), ROOT / "chapters/06_batching.ipynb")
    write(solutions.build(), ROOT / "solutions/06_batching.ipynb")


if __name__ == "__main__":
    main()
