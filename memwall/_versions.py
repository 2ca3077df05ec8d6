"""The oldest torch and transformers memwall works with, checked once when they are first used.

An older release fails deep inside a call (`enable_gqa` is an unexpected keyword, `dtype=` is
ignored and the model loads in the wrong precision); a clear message at import is kinder.
pyproject.toml's `engine` extra declares the same floors (a test keeps the two in step).
"""

from __future__ import annotations

import importlib.metadata
import re

MINIMUM = {
    "torch": "2.5",  # F.scaled_dot_product_attention(..., enable_gqa=True)
    "transformers": "4.56",  # from_pretrained(..., dtype=...)
}


def release(version: str) -> tuple[int, ...]:
    """The numeric part of a version: '2.13.0+cpu' -> (2, 13, 0), '4.57.0.dev0' -> (4, 57, 0)."""
    numbers = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in numbers.group(0).split(".")) if numbers else ()


def require(package: str) -> None:
    """Raise ImportError naming the upgrade when `package` is older than memwall needs."""
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return  # importing it will say that it is missing
    if release(installed) < release(MINIMUM[package]):
        raise ImportError(
            f"memwall needs {package}>={MINIMUM[package]}, but {package} {installed} is installed: "
            f'pip install -U "{package}>={MINIMUM[package]}"'
        )
