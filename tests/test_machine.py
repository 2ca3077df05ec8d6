"""The machine room: the cores a container may use, the cache levels, and the one rule that sizes
a bandwidth test's buffers (past the cache where the budget allows, else inside it, and then it
says so)."""

import dataclasses

import pytest

from memwall.machine import caches, cores
from memwall.machine.caches import CacheLevel, level_of
from memwall.machine.memory import MiB
from memwall.machine.working_set import (
    CACHE_NOTE,
    LAST_LEVEL_CACHE,
    cache_working_set,
    dram_working_set,
)

HUGE_L3 = (CacheLevel(1, 48 * 2**10, 1), CacheLevel(2, 2 * MiB, 1), CacheLevel(3, 480 * MiB, 2))


def fake_cgroup(tmp_path, lines: str, files: dict[str, str]):
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(lines)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cpu_quota_v2_is_the_tightest_along_the_path(tmp_path):
    root = fake_cgroup(
        tmp_path,
        "0::/kubepods/pod1/box\n",
        {
            "cgroup.controllers": "cpu\n",
            "kubepods/cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "150000 100000\n",  # 1.5 cores for the pod
            "kubepods/pod1/box/cpu.max": "max 100000\n",
        },
    )
    assert cores.cpu_quota(root) == pytest.approx(1.5)
    limit = cores.CoreLimit(visible=8, affinity=8, quota_cpus=cores.cpu_quota(root))
    assert limit.usable == 1  # a second thread would be throttled part way through each period
    assert "CPU quota 1.5 cores" in limit.describe() and "of 8 visible" in limit.describe()


def test_cpu_quota_v1_and_no_quota(tmp_path):
    lines = "3:cpu,cpuacct:/docker/abc\n0::/\n"
    quota = {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "200000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    assert cores.cpu_quota(fake_cgroup(tmp_path / "a", lines, quota)) == pytest.approx(2.0)
    none = {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    assert cores.cpu_quota(fake_cgroup(tmp_path / "b", lines, none)) is None
    assert cores.cpu_quota(fake_cgroup(tmp_path / "c", "", {})) is None


def test_usable_cores_follow_affinity_and_quota():
    assert cores.CoreLimit(visible=4, affinity=2, quota_cpus=None).usable == 2
    assert cores.CoreLimit(visible=4, affinity=4, quota_cpus=0.5).usable == 1  # never 0
    assert cores.CoreLimit(visible=4, affinity=4, quota_cpus=3.0).usable == 3
    here = cores.core_limit()
    assert 1 <= here.usable <= here.affinity <= here.visible
    assert cores.usable_cores() == here.usable


def test_cache_levels_come_from_sysfs(tmp_path):
    for index, (level, kind, size, shared) in enumerate(
        [(1, "Data", "48K", "0"), (1, "Instruction", "32K", "0"), (2, "Unified", "2048K", "0"),
         (3, "Unified", "491520K", "0-1")]
    ):  # fmt: skip
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{text}\n")
        (folder / "shared_cpu_list").write_text(f"{shared}\n")
    assert caches.cache_levels.__wrapped__(str(tmp_path)) == HUGE_L3


def test_which_level_a_working_set_lives_in():
    assert level_of(32 * 2**10, HUGE_L3) == "L1"
    assert level_of(1 * MiB, HUGE_L3) == "L2"
    assert level_of(64 * MiB, HUGE_L3) == "L3"  # a "DRAM" test matrix beside a huge cache
    assert level_of(538 * MiB, HUGE_L3) == "DRAM"
    assert level_of(64 * MiB, (CacheLevel(3, 32 * MiB, 2),)) == "DRAM"
    assert level_of(1, ()) == "DRAM"  # no cache known
    with pytest.raises(ValueError, match="at least 0"):
        level_of(-1, HUGE_L3)


def test_parse_size():
    assert caches.parse_size("32768K\n") == 32 * MiB
    assert caches.parse_size("2M") == 2 * MiB
    assert caches.parse_size("junk") == 0


def test_the_dram_buffer_is_4x_the_cache_within_the_budget():
    assert dram_working_set(1, 32 * MiB, 256 * MiB).bytes == 128 * MiB
    assert dram_working_set(1, 16 * MiB, 256 * MiB).bytes == 128 * MiB  # at least 128 MiB
    assert dram_working_set(1, 48 * MiB, 256 * MiB).bytes == 192 * MiB
    small = dram_working_set(1, 16 * MiB, 64 * MiB)  # a tight budget: 4x the cache is 64 MiB
    assert (small.bytes, small.level, small.note) == (64 * MiB, "DRAM", "")
    two = dram_working_set(2, 32 * MiB, 256 * MiB)
    assert two.bytes == 128 * MiB and two.level == "DRAM"
    assert dram_working_set(1, 0, 256 * MiB).bytes == 128 * MiB  # cache unknown


@pytest.mark.parametrize("cache_mib", [300, 480])
def test_a_cache_the_budget_cannot_beat_is_measured_and_named(cache_mib):
    chosen = dram_working_set(1, cache_mib * MiB, 256 * MiB)
    assert chosen.level == LAST_LEVEL_CACHE
    assert chosen.note.startswith(CACHE_NOTE) and f"({cache_mib} MiB)" in chosen.note
    assert chosen.bytes <= cache_mib * MiB // 2  # inside the cache, not an unknown mix
    assert chosen.bytes <= 256 * MiB


def test_between_one_and_two_caches_is_not_called_dram():
    chosen = dram_working_set(1, 100 * MiB, 150 * MiB)  # 150 MiB would be 1.5x the cache
    assert chosen.level == LAST_LEVEL_CACHE and chosen.bytes == 50 * MiB


def test_the_cache_working_set_sits_inside_the_cache():
    assert cache_working_set(1, 32 * MiB, 256 * MiB).bytes == 16 * MiB
    assert cache_working_set(2, 32 * MiB, 256 * MiB).bytes == 8 * MiB
    assert cache_working_set(1, 480 * MiB, 100 * MiB).bytes == 100 * MiB  # the budget still rules
    assert cache_working_set(1, 480 * MiB, 256 * MiB).bytes == 128 * MiB  # enough to time it
    with pytest.raises(ValueError, match="unknown"):
        cache_working_set(1, 0, 256 * MiB)


@pytest.mark.parametrize("buffers, budget", [(0, 256 * MiB), (1.5, 256 * MiB), (1, -1)])
def test_bad_sizes_are_clear_errors(buffers, budget):
    with pytest.raises(ValueError, match="buffers|budget_bytes"):
        dram_working_set(buffers, 32 * MiB, budget)


def test_a_probe_says_which_level_it_measures(monkeypatch):
    pytest.importorskip("torch")
    from memwall.machine import microbench, probe, working_set

    monkeypatch.setattr(working_set, "last_level_cache_bytes", lambda: 480 * MiB)
    monkeypatch.setattr(working_set, "buffer_budget_bytes", lambda: 16 * MiB)
    # the buffer streams about as fast as a quarter of it: it sits in the cache it was sized for
    monkeypatch.setattr(microbench, "_spill_rates", lambda device, nbytes: (40e9, 42e9, 44e9))
    cached = probe.RooflineProbe("cpu", reads=1)
    assert cached.level == LAST_LEVEL_CACHE and CACHE_NOTE in cached.note
    assert cached.working_set_bytes <= 16 * MiB
    monkeypatch.setattr(working_set, "last_level_cache_bytes", lambda: 1 * MiB)
    monkeypatch.setattr(working_set, "buffer_budget_bytes", lambda: 8 * MiB)
    past = probe.RooflineProbe("cpu", reads=1)
    assert (past.level, past.note, past.working_set_bytes) == ("DRAM", "", 8 * MiB)
    assert past() > 0 and len(past.samples) == 1
    monkeypatch.setattr(caches, "cache_levels", lambda: HUGE_L3)
    chosen = probe.RooflineProbe("cpu", working_set_bytes=4 * MiB, reads=1)
    assert chosen.level == LAST_LEVEL_CACHE and "fits in the L3 cache" in chosen.note
    # its bandwidth is the roof of what fits in the cache, and only an upper bound beyond it
    assert chosen.stand_in_note(100 * MiB) == ""
    assert chosen.stand_in_note(600 * MiB) == chosen.note
    assert past.stand_in_note(600 * MiB) == ""  # a probe of DRAM is DRAM's own roof


def test_a_cache_buffer_that_streams_at_half_a_quarters_speed_is_called_dram(monkeypatch):
    """A process can get much less of a shared last-level cache than the OS reports: a 128 MiB
    buffer inside a reported 480 MiB cache that reads at half the speed of 32 MiB reads DRAM."""
    pytest.importorskip("torch")
    from memwall.machine import microbench, probe, working_set

    monkeypatch.setattr(working_set, "last_level_cache_bytes", lambda: 480 * MiB)
    monkeypatch.setattr(microbench, "last_level_cache_bytes", lambda: 480 * MiB)
    monkeypatch.setattr(working_set, "buffer_budget_bytes", lambda: 256 * MiB)
    monkeypatch.setattr(caches, "_usable_share", 0)  # what the spill records is undone after
    monkeypatch.setattr(caches, "cache_levels", lambda: HUGE_L3)
    measured = []
    monkeypatch.setattr(
        microbench,
        "_spill_rates",
        lambda device, nbytes: measured.append(nbytes) or (20e9, 43e9, 44e9),
    )
    spilled = probe.RooflineProbe("cpu", reads=1)
    assert measured == [128 * MiB] and spilled.working_set_bytes == 128 * MiB
    assert spilled.level == "DRAM" and CACHE_NOTE not in spilled.note
    assert "480 MiB" in spilled.note and "20.0 GB/s against 44.0 GB/s" in spilled.note
    assert spilled.stand_in_note(600 * MiB) == ""  # its note says why it is DRAM's own roof
    # the half still read fast: the cache ends between 64 and 128 MiB, taken as the middle
    assert caches.usable_levels()[-1].size_bytes == 96 * MiB
    monkeypatch.setattr(caches, "_usable_share", 0)
    monkeypatch.setattr(microbench, "_spill_rates", lambda device, nbytes: (20e9, 21e9, 44e9))
    probe.RooflineProbe("cpu", reads=1)  # already the half read slowly: between 32 and 64 MiB
    assert caches.usable_levels()[-1].size_bytes == 48 * MiB
    monkeypatch.setattr(microbench, "_spill_rates", lambda device, nbytes: (36e9, 40e9, 44e9))
    assert probe.RooflineProbe("cpu", reads=1).level == LAST_LEVEL_CACHE  # within the gap


def test_a_timed_cache_share_cuts_the_last_level(monkeypatch):
    monkeypatch.setattr(caches, "cache_levels", lambda: HUGE_L3)
    monkeypatch.setattr(caches, "_usable_share", 0)
    assert caches.usable_levels() == HUGE_L3 and level_of(100 * MiB) == "L3"
    caches.found_usable_cache(96 * MiB)
    assert caches.usable_levels()[-1] == CacheLevel(3, 96 * MiB, 2)
    assert level_of(96 * MiB) == "L3" and level_of(100 * MiB) == "DRAM"
    assert level_of(100 * MiB, HUGE_L3) == "L3"  # levels passed in are taken as they are
    caches.found_usable_cache(384 * MiB)  # a later, larger finding does not widen it again
    assert caches.usable_levels()[-1].size_bytes == 96 * MiB
    caches.found_usable_cache(1 * MiB)  # never below the level under it
    assert caches.usable_levels()[-1].size_bytes == 2 * MiB
    assert a_measurement().roof_for(100 * MiB).level == "DRAM"


def a_measurement(memory_level="DRAM", cache_bandwidth=90e9):
    from memwall.machine.measurement import Measurement

    return Measurement("cpu model", "cpu", "2.x", 2, 30e9, 28e9, 30e9, {"fp32": 1e11},
                       memory_level=memory_level, cache_bandwidth=cache_bandwidth)  # fmt: skip


def test_each_working_set_is_judged_against_its_own_levels_roof():
    measured = a_measurement()
    assert measured.roof_for(538 * MiB, HUGE_L3) == ("DRAM", 30e9, "")
    assert measured.roof_for(64 * MiB, HUGE_L3) == ("L3", 90e9, "")  # the cache is a roof too
    l2 = measured.roof_for(1 * MiB, HUGE_L3)
    assert l2.level == "L2" and l2.bandwidth == 90e9 and "faster" in l2.note
    gpu = dataclasses.replace(measured, device_type="cuda")
    assert gpu.roof_for(64 * MiB, HUGE_L3) == ("DRAM", 30e9, "")


def test_dram_that_was_not_measured_is_named_as_a_bound():
    measured = a_measurement(memory_level=LAST_LEVEL_CACHE, cache_bandwidth=30e9)
    roof = measured.roof_for(538 * MiB, HUGE_L3)
    assert roof.level == "DRAM" and roof.bandwidth == 30e9 and "upper bound" in roof.note


def test_openmp_spins_briefly_unless_torch_loaded_first_or_the_user_chose():
    from memwall.machine.cores import SHORT_SPIN, spin_briefly

    environ = {}
    assert spin_briefly(environ, modules={}) and environ == {"GOMP_SPINCOUNT": SHORT_SPIN}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not spin_briefly(chosen, modules={}) and "GOMP_SPINCOUNT" not in chosen
    environ = {}
    assert not spin_briefly(environ, modules={"torch": object()}) and environ == {}


def test_importing_memwall_before_torch_sets_the_spin_for_openmp():
    import os
    import subprocess
    import sys

    code = "import os, memwall, torch; print(os.environ.get('GOMP_SPINCOUNT'))"
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "1000", out.stderr
    late = "import os, torch, memwall; print(os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", late], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "None", out.stderr
