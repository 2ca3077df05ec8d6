"""Where memwall keeps what it builds once and reuses: converted models, compiled kernels.

A module of its own so that `models` and `engine` both find the cache folder without importing
each other (imports flow one way: the engine must not depend on the model loader).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted models and compiled kernels live: $MEMWALL_CACHE, else ~/.cache/memwall."""
    folder = Path(os.environ.get("MEMWALL_CACHE", Path.home() / ".cache" / "memwall"))
    if folder.exists() and not folder.is_dir():  # said now, not after a slow conversion
        raise ValueError(f"memwall's cache {folder} (set by $MEMWALL_CACHE) is not a folder")
    return folder
