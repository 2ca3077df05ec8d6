"""Where this process's control-group files are, for the limits a container sets.

A container's memory and CPU limits live in cgroup files, not in /proc/meminfo or the CPU count,
which describe the whole host. /proc/self/cgroup names this process's group in each hierarchy:
one line ``0::/path`` for cgroup v2 (a single tree mounted at /sys/fs/cgroup, or at
/sys/fs/cgroup/unified beside v1), and ``N:memory:/path`` or ``N:cpu,cpuacct:/path`` per v1
controller (one tree per controller, at /sys/fs/cgroup/<controllers>). A limit set on any
ancestor binds too, so callers read the group and every ancestor up to the mount.

Every function takes `root` (default "/") so tests can build a fake tree. Standard library only.
"""

from __future__ import annotations

from pathlib import Path


def _membership(root: Path) -> list[tuple[str, list[str], str]]:
    """(hierarchy id, controllers, path) for each line of /proc/self/cgroup; empty if absent."""
    try:
        text = (root / "proc/self/cgroup").read_text()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if path:
            lines.append((hierarchy, [c for c in controllers.split(",") if c], path))
    return lines


def _lineage(mount: Path, relative: str) -> list[Path]:
    """The group's directory and its ancestors up to `mount`, innermost first, those that exist.

    Without a cgroup namespace a container sees its host-side path (``/docker/abc``) while its
    own group is mounted at the top, so a path that does not exist falls back to the mount."""
    parts = [part for part in relative.strip("/").split("/") if part and part != ".."]
    candidates = [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]
    return [folder for folder in candidates if folder.is_dir()]


def v2_folders(root: str | Path = "/") -> list[Path]:
    """This process's cgroup v2 folder and its ancestors, innermost first (empty without v2)."""
    root = Path(root)
    for hierarchy, controllers, path in _membership(root):
        if hierarchy == "0" and not controllers:
            for mount in (root / "sys/fs/cgroup", root / "sys/fs/cgroup/unified"):
                if (mount / "cgroup.controllers").is_file():
                    return _lineage(mount, path)
    return []


def v1_folders(controller: str, root: str | Path = "/") -> list[Path]:
    """This process's folder in the v1 hierarchy of `controller` ("memory", "cpu") and its
    ancestors, innermost first (empty where that hierarchy is not mounted)."""
    root = Path(root)
    for _hierarchy, controllers, path in _membership(root):
        if controller in controllers:
            for name in (",".join(controllers), controller):
                mount = root / "sys/fs/cgroup" / name
                if mount.is_dir():
                    return _lineage(mount, path)
    return []


def read_text(folder: Path, name: str) -> str | None:
    """One cgroup file's content, stripped; None where it is missing or unreadable."""
    try:
        return (folder / name).read_text().strip()
    except OSError:
        return None
