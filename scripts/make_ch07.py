"""Write chapter 7 and its solutions notebook:  .venv/bin/python scripts/make_ch07.py  (then `memwall exercises`)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import notebook, write  # noqa: E402
from ch07 import chapter_formats, chapter_measure, solutions  # noqa: E402


def main():
    write(notebook("07_quantization", chapter_formats.cells() + chapter_measure.cells()),
          ROOT / "chapters/07_quantization.ipynb")
    write(solutions.build(), ROOT / "solutions/07_quantization.ipynb")


if __name__ == "__main__":
    main()
