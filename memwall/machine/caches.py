"""The CPU's cache levels, and which level a working set of N bytes lives in.

A stream over a working set runs at the speed of the smallest memory level that holds it: a
64 MiB matrix on a CPU with a 32 MiB last-level cache is read from DRAM, the same matrix beside a
480 MiB cache is read from the cache, and both its time and its "fraction of the roofline" then
answer to the cache's bandwidth. `level_of(n)` names that level from the cache sizes the OS
reports (Linux sysfs, macOS sysctl), cut to what a timing showed this process really gets of a
shared last-level cache (`found_usable_cache`).

The sizes are per cache instance: a core's private L2 holds a working set of one thread, a
shared L3 holds the working sets of every core together. Standard library only.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

DRAM = "DRAM"


@dataclass(frozen=True)
class CacheLevel:
    level: int  # 1, 2, 3, ...
    size_bytes: int  # one instance of this cache
    shared_by: int  # logical CPUs that share one instance (0 where unknown)

    @property
    def name(self) -> str:
        return f"L{self.level}"


def parse_size(text: str) -> int:
    """ "32768K" / "2M" / "1048576" -> bytes (0 for anything else)."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text.rstrip("KMGB")
    return int(digits) * scale if digits.isdigit() else 0


def _shared_by(cpu_list: str) -> int:
    """ "0-3,8" -> 5 logical CPUs."""
    count = 0
    for part in cpu_list.strip().split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            count += int(high) - int(low) + 1 if high.isdigit() else 1
    return count


def _sysfs_levels(folder: Path) -> list[CacheLevel]:
    levels = {}
    for index in sorted(folder.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue  # code, not data: no working set lives there
            level = int((index / "level").read_text())
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        try:
            shared = _shared_by((index / "shared_cpu_list").read_text())
        except OSError:
            shared = 0
        if size and size > levels.get(level, CacheLevel(level, 0, 0)).size_bytes:
            levels[level] = CacheLevel(level, size, shared)
    return [levels[level] for level in sorted(levels)]


def _sysctl_levels() -> list[CacheLevel]:
    names = {1: "hw.l1dcachesize", 2: "hw.l2cachesize", 3: "hw.l3cachesize"}
    levels = []
    for level, name in names.items():
        try:
            out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2)
        except (OSError, subprocess.SubprocessError):
            continue
        value = out.stdout.strip()
        if out.returncode == 0 and value.isdigit() and int(value) > 0:
            levels.append(CacheLevel(level, int(value), 0))
    return levels


@functools.cache
def cache_levels(folder: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[CacheLevel, ...]:
    """The data (and unified) cache levels of CPU 0, smallest first; empty where unknown."""
    levels = _sysfs_levels(Path(folder))
    if not levels and sys.platform == "darwin":
        levels = _sysctl_levels()
    return tuple(levels)


# What a timing showed of the last-level cache this process really gets (0: nothing yet). The OS
# reports the whole cache, but other cores (other tenants, on a shared host) fill it too.
_usable_share = 0


def found_usable_cache(nbytes: int) -> None:
    """Record that a timing (`microbench.working_set_for`) found this process gets about
    `nbytes` of the last-level cache: from then on, a larger working set counts as DRAM's."""
    global _usable_share
    share = max(int(nbytes), 1)
    _usable_share = min(_usable_share, share) if _usable_share else share


def usable_levels() -> tuple[CacheLevel, ...]:
    """`cache_levels()`, the last level cut to what a timing showed this process gets."""
    levels = cache_levels()
    if not (_usable_share and levels and levels[-1].size_bytes > _usable_share):
        return levels
    *inner, last = levels
    floor = inner[-1].size_bytes if inner else 0
    return (*inner, CacheLevel(last.level, max(_usable_share, floor), last.shared_by))


def last_level_cache_bytes() -> int:
    """Size of the largest cache level (L3 on most x86, L2 on Apple silicon); 0 if unknown."""
    levels = cache_levels()
    return levels[-1].size_bytes if levels else 0


def level_of(nbytes: int, levels: tuple[CacheLevel, ...] | None = None) -> str:
    """The memory level a working set of `nbytes` is read from: the smallest cache that holds
    it ("L1", "L2", "L3"), else "DRAM". `levels` defaults to this CPU's, as far as this process
    gets them (`usable_levels`)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be at least 0, got {nbytes!r}.")
    for level in usable_levels() if levels is None else levels:
        if nbytes <= level.size_bytes:
            return level.name
    return DRAM
