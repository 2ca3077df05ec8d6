"""Point the book at your own copy of the repository: `make rename-repo URL=https://github.com/you/memwall`.

Replaces the GitHub URL that `_config.yml`'s `repository.url` names in the files that carry it
(the config, the README's badges, the setup page, the package metadata, the citation) and in
memwall's default for the Colab install cell, and the published site's GitHub Pages address
(https://OWNER.github.io/NAME/, which GitHub derives from the repository) with it. Then `make notebooks` (the Makefile target runs it)
rewrites every generated notebook's install cell. Standard library only; portable, unlike
`sed -i`, whose syntax differs between GNU and BSD (macOS).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (
    "_config.yml",
    "README.md",
    "book/setup.md",
    "book/intro.md",
    "pyproject.toml",
    "CITATION.cff",
    "memwall/notebooks.py",
)
GITHUB_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+$")


def current_url(root: Path = ROOT) -> str:
    """`repository.url` from _config.yml (read as text: no YAML library needed)."""
    in_repository = False
    for line in (root / "_config.yml").read_text().splitlines():
        if re.match(r"^repository:\s*$", line):
            in_repository = True
        elif in_repository and re.match(r"^\s+url:", line):
            return line.split("url:", 1)[1].split("#")[0].strip().strip("'\"")
        elif line and not line[0].isspace():
            in_repository = False
    raise ValueError("_config.yml has no repository.url")


def pages_url(repository_url: str) -> str:
    """The GitHub Pages address of a repository: the owner becomes the host (lower case)."""
    owner, name = repository_url.rstrip("/").split("github.com/")[1].split("/")
    return f"https://{owner.lower()}.github.io/{name}/"


def rename(new_url: str, root: Path = ROOT) -> list[str]:
    """Replace the current repository URL with `new_url` everywhere; return the files changed."""
    new_url = new_url.rstrip("/").removesuffix(".git")
    if not GITHUB_URL.match(new_url):
        raise ValueError(f"expected https://github.com/OWNER/NAME, got {new_url!r}")
    old_url = current_url(root)
    old_slug, new_slug = old_url.split("github.com/")[1], new_url.split("github.com/")[1]
    changed = []
    for name in FILES:
        path = root / name
        if not path.exists():
            continue
        text = path.read_text()
        updated = text
        # github.com/OWNER/NAME, and the slug in Binder (/gh/...) and Colab (/github/...) links.
        for prefix in ("github.com/", "/gh/", "/github/"):
            updated = updated.replace(prefix + old_slug, prefix + new_slug)
        updated = updated.replace(pages_url(old_url), pages_url(new_url))
        if updated != text:
            path.write_text(updated)
            changed.append(name)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="your repository, e.g. https://github.com/you/memwall")
    args = parser.parse_args(argv)
    try:
        changed = rename(args.url)
    except ValueError as error:
        print(f"rename_repo: {error}", file=sys.stderr)
        return 2
    print("updated: " + (", ".join(changed) if changed else "nothing (already that URL)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
