"""Run a student's notebook in a bubblewrap sandbox, with resource limits and a cleared environment.

``Sandbox.command(inner, scratch, channel_dir)`` wraps the pytest command so that it runs with:

- its own PID namespace (the grader and other students' kernels are invisible and unkillable;
  when the sandbox's first process dies every process in it dies, setsid daemons included),
  ``--die-with-parent``, a new session, every namespace unshared (no network), all
  capabilities dropped and an unprivileged uid;
- read-only binds of the system (/usr, /lib, /etc...), the Python installation, the virtual
  environment and the memwall package, with ``memwall/grading`` replaced by a stub that refuses
  to import; ``solutions/``, the submissions folder and the rest of the instructor's files are
  simply not there;
- the scratch folder (a copy of this one notebook) as the only writable place, holding the
  private ``$HOME`` and ``/tmp``; the grader's socket folder read-only;
- limits on address space, file size, open files and core size (``prlimit``), and on the number
  of processes (a pids cgroup when the grader may create one, else RLIMIT_NPROC).

The environment is a short whitelist (``environment``); nothing of the instructor's passes.
The student's processes make themselves non-dumpable (exercise_driver.driver.harden).
"""

import functools
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import memwall

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
CPU_INFO = "/sys/devices/system/cpu"
INSIDE_SCRATCH = "/scratch"
INSIDE_CHANNEL = "/grader"
SANDBOX_UID = 65534
GRADING_STUB = 'raise ImportError("memwall.grading is not available inside the grading sandbox")\n'
PIDS_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 8 * 2**30
    file_bytes: int = 256 * 2**20
    processes: int = 256
    open_files: int = 1024


@functools.cache
def bwrap_path():
    """The bwrap executable, if it exists and can create a sandbox here; else None."""
    found = shutil.which("bwrap")
    if not found:
        return None
    probe = [found, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--", "true"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return found if ok else None


def package_dir() -> Path:
    return Path(memwall.__file__).resolve().parent


def environment(threads, home, tmp, channel_path, call_limit=None) -> dict:
    """The whole environment of the student's processes: nothing of the instructor's."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "MPLBACKEND": "Agg",
        # Only nbval and our recorder: other plugins installed here could change how cells run.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
        "MEMWALL_GRADER_CHANNEL": str(channel_path),
        # memwall found even when it runs from a checkout (only the package folder is bound).
        "PYTHONPATH": str(package_dir().parent),
    }
    if call_limit:
        env["MEMWALL_CALL_TIME_LIMIT"] = f"{call_limit:g}"
    if threads:
        # Parallel notebooks must share the cores, not each grab all of them.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    return env


class Sandbox:
    """bwrap around one notebook run; ``close()`` removes its cgroup."""

    def __init__(self, work_dir: Path, limits: Limits = Limits(), read_only_paths=()):
        self.limits, self.read_only_paths = limits, tuple(str(p) for p in read_only_paths)
        self.stub = Path(work_dir) / "grading_stub.py"
        self.stub.write_text(GRADING_STUB)
        self.cgroup = _make_pids_cgroup(limits.processes)

    def command(self, inner: list, scratch: Path, channel_dir: Path) -> list:
        bwrap = bwrap_path()
        if bwrap is None:
            raise RuntimeError("bwrap is not available")
        args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        for path in SYSTEM_PATHS:
            args += ["--ro-bind-try", path, path]
        # The private /tmp first: a venv or checkout that lives under /tmp (as in a CI clone)
        # is then bound on top of it, instead of being hidden by it.
        args += ["--bind", str(scratch / "tmp"), "/tmp"]
        for path in _python_paths() + list(self.read_only_paths):
            args += ["--ro-bind-try", path, path]
        package = str(package_dir())
        args += ["--ro-bind", package, package, "--tmpfs", f"{package}/grading"]
        args += ["--ro-bind", str(self.stub), f"{package}/grading/__init__.py"]
        args += ["--ro-bind-try", CPU_INFO, CPU_INFO, "--proc", "/proc", "--dev", "/dev"]
        for device in sorted(Path("/dev").glob("nvidia*")):  # a GPU, for chapters that use one
            args += ["--dev-bind-try", str(device), str(device)]
        args += ["--bind", str(scratch), INSIDE_SCRATCH]
        args += ["--ro-bind", str(channel_dir), INSIDE_CHANNEL, "--chdir", INSIDE_SCRATCH]
        return self._limited(args + ["--", *inner])

    def unsandboxed(self, inner: list) -> list:
        """The same resource limits, without the sandbox (``--no-sandbox``)."""
        return self._limited(list(inner))

    def _limited(self, command: list) -> list:
        limits = self.limits
        prlimit = [
            "prlimit", f"--as={limits.memory_bytes}", f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}", "--core=0",
        ]  # fmt: skip
        if self.cgroup is None and os.geteuid() != 0:
            prlimit.append(f"--nproc={_own_process_count() + limits.processes}")
        if shutil.which("prlimit") is None:
            prlimit = []
        command = prlimit + ["--", *command] if prlimit else command
        if self.cgroup is not None:
            # Join the cgroup first, so no process of the notebook escapes the count.
            join = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
            command = ["/bin/sh", "-c", join, str(self.cgroup), *command]
        return command

    def close(self):
        # The last processes of a PID namespace can take a moment to be reaped after it ends.
        for _ in range(50):
            if self.cgroup is None or not self.cgroup.exists():
                return
            try:
                self.cgroup.rmdir()
            except OSError:
                time.sleep(0.05)


PREFLIGHT = (
    "import memwall.exercise_driver.driver, memwall.exercise_driver.recorder, nbval, ipykernel"
)


def preflight(work_dir: Path, limits: Limits = Limits(), read_only_paths=()):
    """None when a sandboxed Python can import what a graded notebook needs, else the error."""
    sandbox = Sandbox(work_dir, limits, read_only_paths)
    scratch, channel = Path(work_dir) / "preflight", Path(work_dir) / "preflight-channel"
    for folder in (scratch / "tmp", scratch / "home", channel):
        folder.mkdir(parents=True)
    command = sandbox.command([sys.executable, "-c", PREFLIGHT], scratch, channel)
    env = environment(1, f"{INSIDE_SCRATCH}/home", "/tmp", f"{INSIDE_CHANNEL}/none")
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    finally:
        sandbox.close()
    lines = (done.stderr or done.stdout).strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit {done.returncode}")


def _python_paths() -> list:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return sorted(str(Path(p).resolve()) for p in paths) + sorted(paths)


def _make_pids_cgroup(limit):
    """A fresh pids cgroup with ``pids.max = limit`` where this process may make one, else None."""
    for root in map(Path, PIDS_CGROUP_ROOTS):
        if not (root / "cgroup.procs").exists():
            continue
        group = root / f"memwall-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / "pids.max").write_text(str(limit))
            return group
        except OSError:
            group.rmdir()
    return None


def _own_process_count() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count
