"""Bounds on one notebook run as a whole: its memory, processes, CPU share and scratch space.

RLIMIT_AS bounds each process, not a notebook: four processes, or pages written to a tmpfs,
add up past it. So each run gets its own cgroups where the grader may make them (cgroup v2:
one group with ``memory.max``, ``pids.max``, ``cpu.max``; v1: one group per controller), with
memory sized to ``--memory-limit`` (tmpfs pages are charged to the group that writes them),
and a CPU quota of its share of the cores, so parallel jobs cannot starve each other. Where
the grader is root, the scratch folder becomes a tmpfs of fixed size and inode count. What
cannot be bounded here is said once on stderr (``missing_bounds``), never silently skipped.
"""

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
_warned = set()


def make_cgroups(limits, cpus=None) -> tuple:
    """(cgroup folders the run must join, names of the bounds that could not be set)."""
    name = f"memwall-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    memory = str(limits.memory_bytes)
    quota = f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}" if cpus else None
    if (CGROUP_ROOT / "cgroup.controllers").exists():  # v2: one group, every controller
        group = _new_group(CGROUP_ROOT, name)
        if group is None:
            return [], ["processes", "memory", "cpu"]
        wanted = {"pids.max": str(limits.processes), "memory.max": memory,
                  "memory.swap.max": "0", "cpu.max": quota}  # fmt: skip
        missing = [file for file in _write(group, wanted) if file != "memory.swap.max"]
        return [group], _names(missing)
    groups, missing = [], []
    for controller, wanted in (
        ("pids", {"pids.max": str(limits.processes)}),
        ("memory", {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}),
        ("cpu", {"cpu.cfs_period_us": str(CPU_PERIOD_US),
                 "cpu.cfs_quota_us": str(int(cpus * CPU_PERIOD_US)) if cpus else None}),
    ):  # fmt: skip
        group = _new_group(CGROUP_ROOT / controller, name)
        if group is None:
            missing.append(controller)
            continue
        failed = _write(group, wanted)
        if failed and not set(failed) <= {"memory.memsw.limit_in_bytes"}:  # no swap accounting
            missing.append(controller)
            remove_cgroups([group])
        else:
            groups.append(group)
    return groups, _names(missing)


def remove_cgroups(groups):
    # The last processes of a PID namespace can take a moment to be reaped after it ends.
    for group in groups:
        for _ in range(50):
            if not group.exists():
                break
            try:
                group.rmdir()
            except OSError:
                time.sleep(0.05)


def join_command(groups, command: list) -> list:
    """``command`` started inside ``groups``, so no process of the notebook escapes them."""
    if not groups:
        return command
    join = 'for g in $0; do echo $$ > "$g/cgroup.procs" || exit 126; done; exec "$@"'
    return ["/bin/sh", "-c", join, " ".join(str(group) for group in groups), *command]


def mount_scratch_quota(folder: Path, size_bytes: int, inodes: int) -> bool:
    """Make ``folder`` a tmpfs of ``size_bytes`` and ``inodes`` (root only); True if it is one."""
    mount = shutil.which("mount")
    if os.geteuid() != 0 or mount is None:
        return False
    options = f"size={size_bytes},nr_inodes={inodes},mode=0755"
    done = subprocess.run([mount, "-t", "tmpfs", "-o", options, "memwall-scratch", str(folder)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def unmount_scratch(folder: Path):
    umount = shutil.which("umount") or "umount"
    if subprocess.run([umount, str(folder)], capture_output=True).returncode != 0:
        subprocess.run([umount, "--lazy", str(folder)], capture_output=True)


def warn_once(missing):
    """Say once per grading process which bounds this machine does not allow."""
    new = [name for name in missing if name not in _warned]
    if new:
        _warned.update(new)
        print(
            f"warning: cannot bound {', '.join(new)} here (no writable cgroup v2 or v1, or not "
            "root): a notebook is then bounded per process only (RLIMIT_AS, RLIMIT_NPROC, "
            "RLIMIT_FSIZE), not as a whole",
            file=sys.stderr,
        )


def _new_group(root: Path, name: str):
    if not (root / "cgroup.procs").exists():
        return None
    group = root / name
    try:
        group.mkdir()
    except OSError:
        return None
    return group


def _write(group: Path, wanted: dict) -> list:
    failed = []
    for file, value in wanted.items():
        if value is None:
            continue
        try:
            (group / file).write_text(value)
        except OSError:
            failed.append(file)
    return failed


def _names(failed) -> list:
    words = {"pids": "processes", "memory": "memory", "cpu": "cpu"}
    return sorted({words.get(str(item).split(".")[0], str(item)) for item in failed})
