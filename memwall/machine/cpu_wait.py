"""How long this process waited for a CPU: the direct sign that something else held the cores.

Linux counts, for every thread, the time it was ready to run but sat in a run queue because its
core was taken (second field of /proc/self/task/<tid>/schedstat, in nanoseconds). On a quiet
machine that stays near zero; beside a busy process, every thread that wants a core waits for its
turn. A container held to a CPU quota also waits when its quota runs out (the cgroup's throttled
time). Both are this process's own experience, so they hold in a container too, where
/proc/stat's counters describe the whole host.

A speed path that moves to fewer threads because another process holds a core
(machine/step_threads.py) stops waiting, but then measures a smaller machine; it says so through
`note_fewer_threads`, and a span counts those steps too.

`CpuWait()` starts a span; `share()` is the part of the time this process's threads wanted a CPU
that they spent waiting for one, since the start or the last `restart()`. Standard library only;
where the counters cannot be read (not Linux, or a sandboxed kernel without them), the share is
None, and `waits_are_counted()` says so: a busy neighbour then shows only in the timings.
"""

from __future__ import annotations

import os
from pathlib import Path

from memwall.machine import cgroup

_fewer_thread_steps = 0  # steps a speed path ran on fewer threads than it has, in all


def note_fewer_threads(steps: int = 1) -> None:
    """A speed path ran `steps` steps on fewer threads because another process held a core."""
    global _fewer_thread_steps
    _fewer_thread_steps += steps


def _threads_ran_and_waited(task_dir: Path) -> dict[str, tuple[int, int]] | None:
    """{thread id: (ns on a CPU, ns waiting in a run queue)} of this process; None off Linux,
    and where no thread's counters can be read (a sandboxed kernel such as gVisor has none)."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return None
    counts = {}
    for tid in tids:
        try:
            ran, waited = (task_dir / tid / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue  # the thread ended between the listing and the read
        counts[tid] = (int(ran), int(waited))
    return counts or None  # every thread vanished, or none has counters: nothing to compare


def waits_are_counted(task_dir: str | Path = "/proc/self/task") -> bool:
    """Whether this system tells a process how long its threads waited for a CPU."""
    return _threads_ran_and_waited(Path(task_dir)) is not None


def throttled_ns(root: str | Path = "/") -> int:
    """Time the container's CPU quota held this process's group back, in ns (0 without one)."""
    total = 0
    for folder in cgroup.v2_folders(root):
        total += 1000 * _stat_field(cgroup.read_text(folder, "cpu.stat"), "throttled_usec")
    for folder in cgroup.v1_folders("cpu", root):
        total += _stat_field(cgroup.read_text(folder, "cpu.stat"), "throttled_time")
    return total


def _stat_field(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


class CpuWait:
    """A span of this process's life: how much of its threads' wanted CPU time was waiting."""

    def __init__(self, task_dir: str | Path = "/proc/self/task", root: str | Path = "/"):
        self.task_dir, self.root = Path(task_dir), root
        self.restart()

    def restart(self) -> None:
        self.start = _threads_ran_and_waited(self.task_dir)
        self.start_throttled = throttled_ns(self.root)
        self.start_fewer = _fewer_thread_steps

    def fewer_thread_steps(self) -> int:
        """Steps a speed path ran on fewer threads (another process held a core) in the span."""
        return _fewer_thread_steps - self.start_fewer

    def totals(self) -> tuple[float, float] | None:
        """(seconds on a CPU, seconds waiting for one) of this process's threads in the span,
        quota throttling counted as waiting; None where the counters cannot be read."""
        now = _threads_ran_and_waited(self.task_dir)
        if now is None or self.start is None:
            return None
        ran = waited = 0
        for tid, (ran_now, waited_now) in now.items():
            ran_then, waited_then = self.start.get(tid, (0, 0))  # a new thread counts from 0
            ran += max(0, ran_now - ran_then)
            waited += max(0, waited_now - waited_then)
        waited += max(0, throttled_ns(self.root) - self.start_throttled)
        return ran / 1e9, waited / 1e9

    def share(self) -> float | None:
        """Waiting over (running + waiting) in the span; None where it cannot be read."""
        totals = self.totals()
        if totals is None:
            return None
        ran, waited = totals
        return waited / (ran + waited) if ran + waited > 0 else 0.0
