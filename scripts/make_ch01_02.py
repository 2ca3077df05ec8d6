"""Write the notebooks of chapters 1 and 2: chapters/ (no outputs) and solutions/.

    .venv/bin/python scripts/make_ch01_02.py          # then: memwall exercises

The notebook contents live in scripts/ch01_02/; exercises/ is generated from solutions/ by
`memwall exercises`, never by this script.
"""

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nbcells import write  # noqa: E402

NOTEBOOKS = {
    "chapters/01_two_phases.ipynb": "ch01_02.chapter01",
    "chapters/02_roofline.ipynb": "ch01_02.chapter02",
    "solutions/01_two_phases.ipynb": "ch01_02.solutions01",
    "solutions/02_roofline.ipynb": "ch01_02.solutions02",
}


def main(only=()):
    for path, module_name in NOTEBOOKS.items():
        if only and not any(name in path for name in only):
            continue
        module = importlib.import_module(module_name)
        target = ROOT / path
        target.parent.mkdir(parents=True, exist_ok=True)
        write(module.build(), target)


if __name__ == "__main__":
    main(sys.argv[1:])
