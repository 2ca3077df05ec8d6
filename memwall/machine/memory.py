"""How much memory this process may use here, and how much it uses.

A container (Binder gives a session 1-2 GB) enforces its limit through a cgroup, while
/proc/meminfo describes the whole host. `memory_limit()` gives the one answer memwall uses: the
tightest cgroup limit along this process's group (v2 `memory.max`, v1 `memory.limit_in_bytes`),
its headroom, and the host's figures beside them. `buffer_budget_bytes()` turns it into the most
that one measurement's buffers may take, so a bandwidth probe never crowds out the model it
measures. `peak_rss_bytes()` and `current_rss_bytes()` say what the process holds.

Standard library only; every reader takes `root` so tests can fake the files.
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from memwall.machine import cgroup

MiB = 2**20
# cgroup v1 writes a number near 2**63 for "no limit" (v2 writes "max").
NO_LIMIT = 2**60
# One measurement's buffers take at most this share of the available memory...
BUDGET_SHARE = 8
# ...and at most this much: a probe sits beside a model in a 1-2 GB session.
BUDGET_CAP = 256 * MiB


@dataclass(frozen=True)
class MemoryLimit:
    """What this process may use. Bytes; `limit_bytes` is None where no cgroup limit is set."""

    source: str  # "cgroup v2", "cgroup v1" or "host"
    limit_bytes: int | None  # the tightest limit on this group or an ancestor
    used_bytes: int | None  # the group's usage, less page cache the kernel can drop
    host_total_bytes: int  # MemTotal (0 if unknown)
    host_available_bytes: int  # MemAvailable (0 if unknown)

    @property
    def total_bytes(self) -> int:
        """Memory this process could ever have: the limit, or the host's total."""
        if self.limit_bytes is None:
            return self.host_total_bytes
        return min(self.limit_bytes, self.host_total_bytes or self.limit_bytes)

    @property
    def available_bytes(self) -> int:
        """Memory a new allocation can take without swapping or meeting the limit; 0 if unknown."""
        free = self.host_available_bytes
        if self.limit_bytes is not None:
            headroom = max(0, self.limit_bytes - (self.used_bytes or 0))
            free = min(free, headroom) if free else headroom
        return free


def _number(text: str | None) -> int | None:
    """A limit file's value in bytes; None for "max", a no-limit number, or junk."""
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if value < NO_LIMIT else None


def _reclaimable(folder: Path, key: str) -> int:
    """Inactive page cache in memory.stat: counted as usage, but the kernel drops it first."""
    for line in (cgroup.read_text(folder, "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_limit(root) -> tuple[str, int | None, int | None] | None:
    """(source, limit, usage) from the first cgroup version that has memory files here."""
    schemes = (
        ("cgroup v2", cgroup.v2_folders(root), "memory.max", "memory.current", "inactive_file"),
        (
            "cgroup v1",
            cgroup.v1_folders("memory", root),
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        ),
    )
    for source, folders, limit_file, usage_file, inactive in schemes:
        with_limit = [f for f in folders if cgroup.read_text(f, limit_file) is not None]
        if not with_limit:
            continue
        tightest = None  # (headroom, limit, usage): a parent's limit counts its children's usage
        for folder in with_limit:
            limit = _number(cgroup.read_text(folder, limit_file))
            if limit is None:
                continue
            usage = _number(cgroup.read_text(folder, usage_file)) or 0
            usage = max(0, usage - _reclaimable(folder, inactive))
            if tightest is None or limit - usage < tightest[0]:
                tightest = (limit - usage, limit, usage)
        return (source, None, None) if tightest is None else (source, *tightest[1:])
    return None


def _meminfo(root: Path) -> dict[str, int]:
    """MemTotal and MemAvailable in bytes, from /proc/meminfo (empty where it is missing)."""
    found = {}
    try:
        for line in (root / "proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("MemTotal", "MemAvailable") and value.split()[0].isdigit():
                found[name] = int(value.split()[0]) * 1024
    except (OSError, IndexError):
        pass
    return found


def _sysconf_pages(name: str) -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf(name)
    except (ValueError, OSError, AttributeError):
        return 0


def memory_limit(root: str | Path = "/") -> MemoryLimit:
    """The container's memory limit (cgroup v2, else v1) and the host's memory, read now."""
    root = Path(root)
    meminfo = _meminfo(root)
    on_this_host = root == Path("/")
    total = meminfo.get("MemTotal") or (_sysconf_pages("SC_PHYS_PAGES") if on_this_host else 0)
    free = meminfo.get("MemAvailable") or (_sysconf_pages("SC_AVPHYS_PAGES") if on_this_host else 0)
    found = _cgroup_limit(root)
    if found is None or found[1] is None:
        return MemoryLimit("host", None, None, total, free)
    source, limit, usage = found
    return MemoryLimit(source, limit, usage, total, free)


def available_memory_bytes(root: str | Path = "/") -> int:
    """Memory a new allocation can take here (container limit and host both counted); 0 if
    unknown."""
    return memory_limit(root).available_bytes


def buffer_budget_bytes(available: int | None = None) -> int:
    """The most one measurement's buffers may take: an eighth of the available memory, and no
    more than BUDGET_CAP (unknown memory: the cap). `available` defaults to this machine's."""
    available = available_memory_bytes() if available is None else available
    if available < 0:
        raise ValueError(f"available must be at least 0 bytes, got {available!r}.")
    budget = min(available // BUDGET_SHARE, BUDGET_CAP) if available else BUDGET_CAP
    return max(budget // MiB, 1) * MiB


def check_fits(nbytes: int, device, what: str, advice: str) -> None:
    """A ValueError, before anything is allocated, when `nbytes` for `what` exceed the memory
    free on `device` (the GPU's, or what this process may still use on a CPU); nothing where
    that is unknown."""
    if str(device).startswith("cuda"):
        import torch

        free = torch.cuda.mem_get_info(torch.device(device))[0]
    else:
        free = available_memory_bytes()
    if free and nbytes > free:
        raise ValueError(
            f"{what} needs {nbytes / 1e9:.1f} GB and {free / 1e9:.1f} GB is free here; {advice}"
        )


def peak_rss_bytes(children: bool = False) -> int:
    """The most resident memory this process has held so far (`children`: the largest peak of
    its finished, reaped child processes instead)."""
    if not children:
        # The kernel's high-water mark of this program's own memory. getrusage's peak is not:
        # Linux carries it over from the process that started this one (a child started by a
        # 3 GB parent reports 3 GB).
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    peak = resource.getrusage(who).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


def current_rss_bytes() -> int:
    """Resident memory of this process now (0 where /proc is missing and psutil too)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return 0
