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
- an unprivileged host user (HOST_UID) when the grader runs as root, so that what the
  sandbox can read is what any user may read: never /etc/shadow or root's files;
- limits on address space, file size, open files and core size (``prlimit``); the run as a
  whole in cgroups for memory (tmpfs included), processes and its CPU share where the grader
  may make them (``bounds.py``; else RLIMIT_NPROC and a warning); ``/dev/shm`` a small tmpfs.

The environment is a short whitelist (``environment``); nothing of the instructor's passes.
The student's processes make themselves non-dumpable (exercise_driver.driver.harden).
"""

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import memwall
from memwall.grading.bounds import join_command, make_cgroups, remove_cgroups, warn_once

SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
CPU_INFO = "/sys/devices/system/cpu"
INSIDE_SCRATCH = "/scratch"
INSIDE_CHANNEL = "/grader"
SANDBOX_UID = 65534
# The host user that student code runs as when the grader is root: a user namespace's uid maps
# back to the real uid outside, so bwrap's "nobody" alone would still read root's files.
HOST_UID = HOST_GID = 65534
ROOT_UNSHARE = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try")  # fmt: skip
BECOME_NOBODY = (
    "/usr/bin/setpriv", f"--reuid={HOST_UID}", f"--regid={HOST_GID}", "--clear-groups",
    "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
)  # fmt: skip
GRADING_STUB = 'raise ImportError("memwall.grading is not available inside the grading sandbox")\n'


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 8 * 2**30
    file_bytes: int = 256 * 2**20
    processes: int = 256
    open_files: int = 1024
    # The scratch folder (home, /tmp, the working folder) where the grader may mount a tmpfs.
    scratch_bytes: int = 1 * 2**30
    scratch_inodes: int = 20_000
    shm_bytes: int = 64 * 2**20


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

    def __init__(self, work_dir: Path, limits: Limits = Limits(), read_only_paths=(), cpus=None):
        self.limits, self.read_only_paths = limits, tuple(str(p) for p in read_only_paths)
        self.stub = Path(work_dir) / "grading_stub.py"
        self.stub.write_text(GRADING_STUB)
        self.cgroups, self.missing = make_cgroups(limits, cpus)
        warn_once(self.missing)

    def command(self, inner: list, scratch: Path, channel_dir: Path) -> list:
        bwrap = bwrap_path()
        if bwrap is None:
            raise RuntimeError("bwrap is not available")
        if os.geteuid() == 0:
            # No user namespace: its uid would map back to host root, whose files it could then
            # read. bwrap mounts as root; the first thing inside becomes the host's nobody.
            args = [bwrap, *ROOT_UNSHARE, "--die-with-parent", "--new-session"]
            inner = [*BECOME_NOBODY, *inner]
        else:
            args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
            args += ["--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        for path in SYSTEM_PATHS:
            args += ["--ro-bind-try", path, path]
        # The private /tmp first: a venv or checkout that lives under /tmp (as in a CI clone)
        # is then bound on top of it, instead of being hidden by it.
        args += ["--bind", str(scratch / "tmp"), "/tmp"]
        for path in _python_paths() + list(self.read_only_paths):
            args += ["--ro-bind-try", path, path]
        package = str(package_dir())
        # memwall.grading is hidden by a small tmpfs, made read-only once the stub is in it.
        args += ["--ro-bind", package, package, "--size", "65536", "--tmpfs", f"{package}/grading"]
        args += ["--ro-bind", str(self.stub), f"{package}/grading/__init__.py"]
        args += ["--remount-ro", f"{package}/grading"]
        args += ["--ro-bind-try", CPU_INFO, CPU_INFO, "--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(self.limits.shm_bytes), "--tmpfs", "/dev/shm"]
        for device in sorted(Path("/dev").glob("nvidia*")):  # a GPU, for chapters that use one
            args += ["--dev-bind-try", str(device), str(device)]
        args += ["--bind", str(scratch), INSIDE_SCRATCH]
        args += ["--ro-bind", str(channel_dir), INSIDE_CHANNEL, "--chdir", INSIDE_SCRATCH]
        if os.geteuid() == 0:
            args = _with_open_parents(args)
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
        if "processes" in self.missing:
            uid = HOST_UID if os.geteuid() == 0 else os.getuid()
            prlimit.append(f"--nproc={_process_count(uid) + limits.processes}")
        if shutil.which("prlimit") is None:
            prlimit = []
        command = prlimit + ["--", *command] if prlimit else command
        return join_command(self.cgroups, command)

    def close(self):
        remove_cgroups(self.cgroups)


PREFLIGHT = (
    "import memwall.exercise_driver.driver, memwall.exercise_driver.recorder, nbval, ipykernel"
)


def preflight(work_dir: Path, limits: Limits = Limits(), read_only_paths=()):
    """None when a sandboxed Python can import what a graded notebook needs, else the error."""
    sandbox = Sandbox(work_dir, limits, read_only_paths)
    scratch, channel = Path(work_dir) / "preflight", Path(work_dir) / "preflight-channel"
    for folder in (scratch / "tmp", scratch / "home", channel):
        folder.mkdir(parents=True)
    os.chmod(work_dir, 0o711)
    hand_to_sandbox_user(scratch)
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


BIND_OPTIONS = ("--bind", "--ro-bind", "--ro-bind-try", "--dev-bind-try")


def _with_open_parents(args: list) -> list:
    """``args`` with each mount point's parents made 0755 just before its mount: bwrap running
    as root makes them 0700, which the sandbox's nobody could not pass through. A mount hides
    what was made under its destination earlier (a private /tmp over a checkout in /tmp), so
    a later mount below it gets its parents made again."""
    result, opened, index = [], set(), 0
    while index < len(args):
        if args[index] not in BIND_OPTIONS or index + 2 >= len(args):
            result.append(args[index])
            index += 1
            continue
        destination = Path(args[index + 2])
        for parent in reversed(destination.parents):
            if str(parent) != "/" and str(parent) not in opened:
                result += ["--perms", "0755", "--dir", str(parent)]
                opened.add(str(parent))
        opened = {path for path in opened if not Path(path).is_relative_to(destination)}
        opened.add(str(destination))  # the mount point itself exists from here on
        result += args[index : index + 3]
        index += 3
    return result


def hand_to_sandbox_user(*paths):
    """Make the run's own folders the unprivileged user's, when the grader is root."""
    if os.geteuid() != 0:
        return
    for path in paths:
        os.chown(path, HOST_UID, HOST_GID)
        for folder, folders, files in os.walk(path):
            for name in folders + files:
                os.chown(os.path.join(folder, name), HOST_UID, HOST_GID, follow_symlinks=False)


def _process_count(uid) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count
