"""Print what every chapter of a built book printed, page by page (for benchmarks/book_configs.sh).

python benchmarks/printed_outputs.py _build/html > outputs.txt
"""

import html
import re
import sys
from pathlib import Path

OUTPUT_BLOCK = re.compile(r'<div class="cell_output docutils container">(.*?)</div>\s*</div>', re.S)
TAG = re.compile(r"<[^>]+>")


def printed_text(page: Path) -> str:
    blocks = OUTPUT_BLOCK.findall(page.read_text(errors="replace"))
    return "\n".join(html.unescape(TAG.sub("", block)).strip() for block in blocks)


def main(html_dir: str) -> None:
    for page in sorted(Path(html_dir, "chapters").glob("*.html")):
        print(f"===== {page.stem}")
        print(printed_text(page))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "_build/html")
