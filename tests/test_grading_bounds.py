"""The attacks of issue 37 on the grading machine itself, each from a student copy: a notebook
cannot read root's files, fill /dev/shm, the host's disk or its inodes, write where memwall.grading
is hidden, or take more memory than --memory-limit with several processes; its neighbour keeps
full marks. Where this machine cannot set a bound (no root, no writable cgroup), that test skips.
"""

import os
from pathlib import Path

import nbformat
import pytest
import test_grading_sandbox as attacks  # tests/ is on sys.path under pytest

from memwall.grading import grade
from memwall.grading.bounds import make_cgroups, remove_cgroups
from memwall.grading.sandbox import Limits, bwrap_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) cannot run here"),
]

LIMITS = Limits(memory_bytes=2**30, scratch_bytes=256 * 2**20, scratch_inodes=20_000)
HEAD = "def matrix_bytes(rows, cols, bytes_per_element):\n"


def fill(name, target, step, count, unit):
    """An exercise that writes ``count`` pieces into ``target`` and reports how far it got."""
    return HEAD + (
        f"    n = 0\n    try:\n        for i in range({count}):\n"
        f"            {step}\n            n += 1\n"
        f"    except OSError as e:\n        raise ValueError(f'{name} {{n}} {unit} {{e.strerror}}')\n"
        f"    raise ValueError(f'{name} {{n}} {unit} no error')\n"
    ).replace("TARGET", target)


ATTACKS = {
    "shadow": HEAD + "    raise ValueError('SHADOW[' + open('/etc/shadow').read()[:40] + ']')\n",
    "shm": fill("shm", "/dev/shm/x", "open('TARGET', 'ab').write(b'x' * 2**20)", 2048, "MiB"),
    "disk": fill("disk", "big", "open('TARGET', 'ab').write(b'x' * 2**20)", 2048, "MiB"),
    "inodes": fill("inodes", "/tmp", "open(f'TARGET/f{i}', 'w').close()", 60_000, "files"),
    "hidden": HEAD
    + (
        "    import memwall, os\n"
        "    folder = os.path.join(os.path.dirname(memwall.__file__), 'grading')\n"
        "    try:\n        open(os.path.join(folder, 'x'), 'wb').write(b'x' * 2**20)\n"
        "    except OSError as e:\n        raise ValueError(f'hidden {e.strerror}')\n"
        "    raise ValueError('hidden wrote')\n"
    ),
    "processes": HEAD
    + (
        "    import subprocess, sys\n"
        "    code = 'import time; b = bytearray(900 * 2**20); time.sleep(3)'\n"
        "    children = [subprocess.Popen([sys.executable, '-c', code]) for _ in range(4)]\n"
        "    raise ValueError(f'processes {[child.wait() for child in children]}')\n"
    ),
}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    (root / "submissions").mkdir()
    (root / "solutions").mkdir()
    chapter = attacks.CHAPTER
    (root / "solutions" / f"{chapter}.ipynb").write_bytes(
        (attacks.FIXTURES / "solutions" / f"{chapter}.ipynb").read_bytes()
    )
    notebooks = {"victim": attacks.student(**attacks.RIGHT)}
    notebooks.update({name: attacks.student(ex1=source) for name, source in ATTACKS.items()})
    for name, nb in notebooks.items():
        nbformat.write(nb, str(root / "submissions" / f"{name}__{chapter}.ipynb"))
    rows = grade(
        root / "submissions", root / "grades.csv", feedback_dir=root / "feedback", timeout=120,
        cell_timeout=60, jobs=2, solutions_dir=root / "solutions", progress=False, sandbox=True,
        limits=LIMITS,
    )  # fmt: skip
    return {row.student: row for row in rows}, root


def said(batch, name) -> str:
    rows, _ = batch
    return rows[name].checks[0].message


def test_the_neighbour_keeps_full_marks_and_attackers_score_zero(batch):
    rows, _ = batch
    assert rows["victim"].total == 5 and rows["victim"].status == "ok"
    assert all(rows[name].total == 0 for name in ATTACKS)


def test_student_code_cannot_read_root_files(batch):
    _, root = batch
    feedback = (root / "feedback" / f"shadow__{attacks.CHAPTER}.txt").read_text()
    assert "SHADOW[" not in feedback and "Permission denied" in feedback


def test_dev_shm_is_size_capped_and_the_hidden_grading_folder_read_only(batch):
    assert "shm 64 MiB No space left on device" in said(batch, "shm")
    assert "hidden Read-only file system" in said(batch, "hidden")


@pytest.mark.skipif(os.geteuid() != 0, reason="the scratch quota is a tmpfs mount: root only")
def test_the_scratch_folder_has_a_size_and_an_inode_quota(batch):
    assert "disk 255 MiB No space left on device" in said(batch, "disk")
    files = int(said(batch, "inodes").split("inodes ")[1].split()[0])
    assert files < LIMITS.scratch_inodes and "No space left" in said(batch, "inodes")


def test_several_processes_cannot_take_more_than_the_memory_limit(batch, tmp_path):
    groups, missing = make_cgroups(LIMITS)
    remove_cgroups(groups)
    if "memory" in missing:
        pytest.skip("no writable memory cgroup here")
    codes = said(batch, "processes").split("processes ")[1]
    survivors = codes.count("0")
    assert survivors <= 1, codes  # 4 x 900 MB against 1 GiB: at most one fits


def test_each_job_gets_a_cpu_quota_of_its_share():
    groups, missing = make_cgroups(LIMITS, cpus=1.5)
    try:
        if "cpu" in missing:
            pytest.skip("no writable cpu cgroup here")
        quotas = [
            (group / name).read_text().split()
            for group in groups
            for name in ("cpu.max", "cpu.cfs_quota_us")
            if (group / name).exists()
        ]
        assert ["150000", "100000"] in quotas or ["150000"] in quotas
    finally:
        remove_cgroups(groups)
    assert not any(Path(group).exists() for group in groups)
