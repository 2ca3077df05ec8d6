"""The cores this process may use: its CPU affinity and its container's CPU quota.

`os.cpu_count()` counts the host's processors. A process may be pinned to fewer (affinity), and
a container may get a share of time that is less than its visible cores (cgroup v2 `cpu.max`,
"QUOTA PERIOD" in microseconds; v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`). A thread count
above the quota gets the whole group throttled part way through each period, and threads that
wait on one another then wait for the throttle as well: fewer threads finish sooner.

Standard library only; `root` lets tests fake the files.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from memwall.machine import cgroup


@dataclass(frozen=True)
class CoreLimit:
    """How many cores this process may use, and why."""

    visible: int  # processors the host reports
    affinity: int  # processors this process may be scheduled on
    quota_cpus: float | None  # the tightest CPU quota, in cores; None: no quota

    @property
    def usable(self) -> int:
        """Whole cores a thread pool should use: the affinity, cut to the quota (at least 1)."""
        cores = self.affinity
        if self.quota_cpus is not None:
            cores = min(cores, math.floor(self.quota_cpus + 1e-9))
        return max(1, cores)

    def describe(self) -> str:
        """One short line, e.g. "2 (of 8 visible; CPU quota 2.0 cores)"."""
        notes = [f"of {self.visible} visible"] if self.visible != self.usable else []
        if self.affinity != self.visible:
            notes.append(f"affinity {self.affinity}")
        if self.quota_cpus is not None:
            notes.append(f"CPU quota {self.quota_cpus:.1f} cores")
        return f"{self.usable}" + (f" ({'; '.join(notes)})" if notes else "")


def _quota_v2(text: str | None) -> float | None:
    quota, _, period = (text or "").partition(" ")
    if quota.isdigit() and period.strip().isdigit() and int(period) > 0:
        return int(quota) / int(period)
    return None  # "max ...": no quota


def _quota_v1(folder: Path) -> float | None:
    quota = cgroup.read_text(folder, "cpu.cfs_quota_us") or ""
    period = cgroup.read_text(folder, "cpu.cfs_period_us") or ""
    if quota.isdigit() and period.isdigit() and int(period) > 0:  # "-1": no quota
        return int(quota) / int(period)
    return None


def cpu_quota(root: str | Path = "/") -> float | None:
    """The tightest CPU quota on this process's group or an ancestor, in cores; None if none."""
    quotas = [_quota_v2(cgroup.read_text(f, "cpu.max")) for f in cgroup.v2_folders(root)]
    quotas += [_quota_v1(f) for f in cgroup.v1_folders("cpu", root)]
    return min((q for q in quotas if q is not None), default=None)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def core_limit(root: str | Path = "/") -> CoreLimit:
    """The cores this process may use, read now."""
    visible = os.cpu_count() or 1
    return CoreLimit(visible, min(_affinity(), visible), cpu_quota(root))


def usable_cores(root: str | Path = "/") -> int:
    """Whole cores a thread pool should use here (affinity and container quota counted)."""
    return core_limit(root).usable


# How long an idle OpenMP thread spins before it sleeps, in rounds (libgomp's GOMP_SPINCOUNT). Its
# default (300,000 rounds, milliseconds) serves a machine with nothing else on it. Beside another
# busy process the spinning thread spends the turn its team-mate needed, and every parallel region
# then waits for a scheduler tick. A short spin costs a quiet machine nothing measurable (a
# region's threads arrive within microseconds of each other) and lets a busy one's threads sleep.
SHORT_SPIN = "1000"


def spin_briefly(environ=os.environ, modules=None) -> bool:
    """Set a short OpenMP spin for this process and its children, where it still takes effect:
    the OpenMP runtime reads it once, when torch loads it. Nothing changes when the user chose a
    wait policy or a spin count. True when it was set."""
    import sys

    loaded = sys.modules if modules is None else modules
    if "torch" in loaded or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SHORT_SPIN
    return True
