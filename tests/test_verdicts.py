"""memwall.verdicts: a disturbed or impossible run never reaches a verdict, and comparisons are
two-sided."""

import numpy as np
import pytest

from memwall import verdicts
from memwall.machine.measurement import Roof
from memwall.verdicts import (
    band_text,
    batch_problem,
    compare,
    disturbed,
    fraction_of_roof,
    percentile,
    roof_problem,
    shorten,
    speculative_problem,
    spread,
    spread_problem,
    stall_problem,
    thread_problem,
    verdict,
    wrap,
)

GB = 1e9


def test_percentile_interpolates_like_numpy():
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(samples, 0) == 1.0
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 100) == 5.0
    assert percentile(samples, 90) == pytest.approx(4.6)  # numpy.percentile gives 4.6
    assert percentile([7.0], 10) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_a_quiet_set_of_timings_passes_and_a_busy_one_does_not():
    quiet = [10.0, 10.2, 9.9, 10.1, 10.4, 10.0, 9.8, 10.3]
    busy = [10.0, 10.1, 60.0, 9.9, 48.0, 10.2, 55.0, 10.0]
    assert spread(quiet) < 1.1
    assert spread_problem(quiet) is None
    problem = spread_problem(busy, what="the decode steps")
    assert problem.startswith("the decode steps: p90/p10")
    assert "> 2.0x" in problem
    # a numpy array, as chapters hold their timings, is judged the same way
    assert spread_problem(np.array(busy)) == spread_problem(busy)
    assert spread(np.array(quiet)) == pytest.approx(spread(quiet))
    # two samples cannot show a spread: not judged, rather than judged wrongly
    assert spread_problem([1.0, 100.0]) is None


def test_a_probe_far_below_the_median_is_a_stall():
    probes = [29.6 * GB, 30.1 * GB, 8.5 * GB, 29.9 * GB]
    assert "8.5 GB/s" in stall_problem(8.5 * GB, probes)
    assert stall_problem(29.6 * GB, probes) is None
    assert stall_problem(8.5 * GB, []) is None  # nothing to compare with
    assert stall_problem(8.5 * GB, np.array(probes)) == stall_problem(8.5 * GB, probes)


def test_threads_that_slow_the_work_down_mean_a_busy_core():
    # chapter 9 of a busy run: 2 threads at 0.03x the speed of one
    assert "0.03x" in thread_problem(seconds_one=0.03, seconds_many=1.0, threads=2)
    assert thread_problem(seconds_one=0.05, seconds_many=0.03, threads=2) is None
    assert thread_problem(seconds_one=0.05, seconds_many=0.055, threads=2) is None
    assert thread_problem(seconds_one=0.05, seconds_many=1.0, threads=1) is None


def test_ratios_beyond_their_physical_bound():
    assert "18.84x" in batch_problem(18.84, batch=8)  # chapter 9's batch of 8
    assert batch_problem(7.5, batch=8) is None
    assert batch_problem(8.5, batch=8) is None  # inside the 15% margin: noise, not a problem
    # chapter 8: 168.71x with at most k + 1 = 5 tokens per pass
    assert speculative_problem(168.71, tokens_per_pass=5, pass_cost=1.2)
    assert speculative_problem(2.5, tokens_per_pass=4.2, pass_cost=1.4) is None
    with pytest.raises(ValueError):
        speculative_problem(2.0, tokens_per_pass=3, pass_cost=0)


def test_a_speed_above_its_levels_roof_is_a_roof_measured_low():
    assert "DRAM roof" in roof_problem(56 * GB, 29.6 * GB)
    assert roof_problem(31 * GB, 29.6 * GB) is None


@pytest.fixture
def quiet_machine(monkeypatch):
    """Verdicts judged as if nothing else ran: these tests are about the wording, and the
    machine that runs them may be busy."""

    class Quiet:
        def totals(self):
            return 1.0, 0.0

        def fewer_thread_steps(self):
            return 0

        def restart(self):
            pass

    monkeypatch.setattr(verdicts, "_since_last_verdict", Quiet())


def test_the_verdict_is_replaced_by_one_disturbed_line(quiet_machine):
    assert verdict("a few rows cost what one costs") == "verdict: a few rows cost what one costs"
    assert verdict("it paid", None, None) == "verdict: it paid"
    line = verdict("it paid", batch_problem(18.84, 8), None)
    assert line.startswith("this run was disturbed: batch 8 over batch 1")
    assert line.replace("\n  ", " ").endswith("rerun on a quiet machine")
    assert "it paid" not in line
    assert disturbed(None, "") is None
    both = disturbed("a", "b")
    assert both == "this run was disturbed: a; b; rerun on a quiet machine"
    many = disturbed("a", None, "b", "c", "d", "e")
    assert many == "this run was disturbed: a; b; c; 2 more; rerun on a quiet machine"


def test_printed_lines_fit_the_column(quiet_machine):
    long = verdict(
        "x",
        spread_problem([1.0, 9.0, 1.0, 8.0, 1.0], what="the steps of a much longer name"),
        thread_problem(0.03, 1.0, 2),
        batch_problem(18.84, 8),
    )
    assert all(len(line) <= verdicts.COLUMN for line in long.splitlines())
    assert wrap("a\nb") == "a\nb"  # the caller's line breaks stay


@pytest.mark.parametrize(
    "a, b, expected",
    [
        (55.9, 1487.9, "faster"),  # chapter 9's "about the same" that was 27x
        (1487.9, 55.9, "slower"),
        (10.0, 10.5, "about the same"),
        (10.5, 10.0, "about the same"),
        (10.0, 11.2, "faster"),
        (11.2, 10.0, "slower"),
    ],
)
def test_compare_is_two_sided(a, b, expected):
    assert compare(a, b) == expected


def test_compare_takes_rates_and_a_band():
    assert compare(200.0, 100.0, lower_is_faster=False) == "faster"
    assert compare(100.0, 200.0, lower_is_faster=False) == "slower"
    assert compare(1.3, 1.0, band=0.5) == "about the same"
    assert band_text(0.1) == "within 10% either way"
    for bad in (0, 1, -0.1):
        with pytest.raises(ValueError):
            compare(1.0, 1.0, band=bad)
    with pytest.raises(ValueError):
        compare(0.0, 1.0)


def test_shorten_gives_any_name_a_known_width():
    name = "Intel(R) Xeon(R) Platinum " + "X" * 100
    assert len(shorten(name, 40)) == 40 and shorten(name, 40).endswith("…")
    assert shorten("AMD  EPYC\t9R14", 40) == "AMD EPYC 9R14"


def test_fraction_of_roof_judges_a_cache_roof_a_low_roof_and_a_stall():
    dram = Roof("DRAM", 30 * GB, "")
    ok = fraction_of_roof(24 * GB, dram)
    assert ok.fraction == pytest.approx(0.8) and ok.level == "DRAM"
    assert ok.notes == () and ok.problems == ()
    # the working set fits in L3: judged against the cache's roof, and said so
    cache = fraction_of_roof(56 * GB, Roof("L3", 120 * GB, ""))
    assert cache.level == "L3" and cache.problems == ()
    assert "L3 cache" in cache.notes[0]
    # the same speed against the DRAM roof is impossible: a roof measured low
    low = fraction_of_roof(56 * GB, dram)
    assert low.fraction > 1 and "measured low" in low.problems[0]
    # a roof probed during a stall flatters the fraction
    stalled = fraction_of_roof(8 * GB, Roof("DRAM", 8.5 * GB, ""), 8.5 * GB, [29.6 * GB] * 4)
    assert stalled.fraction == pytest.approx(8 / 8.5)
    assert "a stall" in stalled.problems[0]
    noted = fraction_of_roof(1 * GB, Roof("DRAM", 30 * GB, "an upper bound"))
    assert noted.notes == ("an upper bound",)


def _fake_threads(folder, counts):
    """/proc/self/task as Linux lays it out: one schedstat per thread (ran ns, waited ns, slices)."""
    for tid, (ran, waited) in counts.items():
        (folder / tid).mkdir(exist_ok=True)
        (folder / tid / "schedstat").write_text(f"{ran} {waited} 7\n")


def test_threads_that_waited_for_a_core_make_a_timed_verdict_disturbed(tmp_path, monkeypatch):
    from memwall.machine import cpu_wait

    _fake_threads(tmp_path, {"1": (1_000, 0), "2": (1_000, 0)})
    span = cpu_wait.CpuWait(task_dir=tmp_path, root=tmp_path)
    # quiet: both threads ran 1 s more and waited 5 ms between them; a third thread appears
    _fake_threads(tmp_path, {"1": (1_000_001_000, 3_000_000), "2": (1_000_001_000, 2_000_000)})
    _fake_threads(tmp_path, {"3": (10_000_000, 0)})
    assert span.share() == pytest.approx(5e6 / (2.01e9 + 5e6))
    assert verdicts.wait_problem(span) is None
    # busy: another process held a core; the main thread waited 0.9 s for 1 s of running
    _fake_threads(tmp_path, {"1": (2_000_001_000, 903_000_000)})
    assert span.share() == pytest.approx(0.905e9 / (3.01e9 + 0.905e9))
    assert "waited for a CPU 23% of the time" in verdicts.wait_problem(span)
    # a short span: a large share of a few ticks is no disturbance
    short = cpu_wait.CpuWait(task_dir=tmp_path, root=tmp_path)
    _fake_threads(tmp_path, {"1": (2_040_001_000, 933_000_000)})
    assert short.share() == pytest.approx(0.03 / 0.07) and verdicts.wait_problem(short) is None
    monkeypatch.setattr(verdicts, "_since_last_verdict", span)
    # a measurement that runs more threads than cores on purpose allows itself more waiting
    assert verdicts.machine_problem() and verdicts.machine_problem(share=0.25) is None
    line = verdicts.verdict("decode is memory-bound")
    assert line.startswith("this run was disturbed: its threads waited for a CPU")
    assert verdicts.verdict("2 + 2 = 4", timed=False) == "verdict: 2 + 2 = 4"


def test_a_system_without_wait_counters_says_so_instead_of_reporting_no_waits(
    tmp_path, monkeypatch
):
    from memwall.machine import cpu_wait, devices

    (tmp_path / "1").mkdir()  # a thread without a schedstat file, as gVisor lays it out
    span = cpu_wait.CpuWait(task_dir=tmp_path, root=tmp_path)
    assert span.share() is None and verdicts.wait_problem(span) is None
    assert not cpu_wait.waits_are_counted(tmp_path)
    monkeypatch.setattr(devices, "waits_are_counted", lambda: False)
    assert "does not count how long threads wait" in devices.describe("cpu")
    monkeypatch.setattr(devices, "waits_are_counted", lambda: True)
    assert "wait" not in devices.describe("cpu")


def test_a_stand_in_roof_gives_no_verdict_and_says_a_rerun_would_not_help():
    note = "DRAM could not be measured within the memory budget: the cache's bandwidth stands in"
    assert verdicts.stand_in_problem("") is None
    line = verdicts.verdict("decode is bound by its bytes", verdicts.stand_in_problem(note),
                            "the steps' repeats spread 3x", timed=False)  # fmt: skip
    assert line == verdicts.wrap(f"no verdict on this machine: {note}")
    assert "quiet" not in line


def test_a_speed_path_on_fewer_threads_makes_a_verdict_disturbed(tmp_path):
    from memwall.machine import cpu_wait

    _fake_threads(tmp_path, {"1": (0, 0)})
    span = cpu_wait.CpuWait(task_dir=tmp_path, root=tmp_path)
    assert verdicts.wait_problem(span) is None
    cpu_wait.note_fewer_threads(3)
    assert verdicts.wait_problem(span).startswith("3 decode steps ran on fewer threads")
    span.restart()
    assert verdicts.wait_problem(span) is None


def test_a_containers_quota_throttling_counts_as_waiting(tmp_path):
    from memwall.machine import cpu_wait

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/job\n")
    group = tmp_path / "sys/fs/cgroup/job"
    group.mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cgroup.controllers").write_text("cpu memory\n")
    (group / "cpu.stat").write_text("usage_usec 10\nthrottled_usec 100\n")
    tasks = tmp_path / "task"
    tasks.mkdir()
    _fake_threads(tasks, {"1": (0, 0)})
    span = cpu_wait.CpuWait(task_dir=tasks, root=tmp_path)
    _fake_threads(tasks, {"1": (700_000_000, 0)})
    (group / "cpu.stat").write_text("usage_usec 10\nthrottled_usec 300100\n")
    assert span.share() == pytest.approx(0.3)


def test_the_wait_counters_are_read_on_linux():
    import sys

    from memwall.machine import cpu_wait

    span = cpu_wait.CpuWait()
    sum(i * i for i in range(200_000))  # some running
    share = span.share()
    if sys.platform.startswith("linux"):
        assert share is not None and 0.0 <= share <= 1.0
