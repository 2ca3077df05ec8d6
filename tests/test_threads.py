"""The fused step's thread count: chosen from the steps' own times, tried rarely, never spinning
two threads against a core another process holds."""

import pytest

from memwall.engine.cpu.threads import LONGEST_WAIT, IdleCores, ThreadChoice


class Machine:
    """A pretend machine: a step takes `seconds[threads]`; `idle` cores beside the step."""

    def __init__(self, seconds, idle):
        self.seconds, self.idle = dict(seconds), idle

    def idle_cores(self):
        return self.idle


def run(choice, machine, steps):
    used = []
    for _ in range(steps):
        threads = choice.threads()
        used.append(threads)
        choice.record(threads, machine.seconds[threads])
    return used


def test_a_quiet_machine_keeps_every_thread_and_tries_one_rarely():
    machine = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    used = run(ThreadChoice(2, machine.idle_cores), machine, 2000)
    tries = used.count(1)
    assert used[0] == 2 and tries <= 12  # waits double: 8, 16, ... up to LONGEST_WAIT


def test_a_busy_core_sends_the_step_to_one_thread_at_once():
    machine = Machine({2: 45.0, 1: 2.0}, idle=0.0)
    used = run(ThreadChoice(2, machine.idle_cores), machine, 500)
    assert used[:3] == [2, 1, 1]  # one slow step, then one thread
    assert used.count(2) == 1  # the other core stays taken: two threads are never tried again


def test_the_step_goes_back_to_every_thread_when_the_core_is_free_again():
    machine = Machine({2: 45.0, 1: 2.0}, idle=0.0)
    choice = ThreadChoice(2, machine.idle_cores)
    run(choice, machine, 100)
    machine.seconds, machine.idle = {2: 1.0, 1: 1.8}, 1.0
    used = run(choice, machine, LONGEST_WAIT + 10)
    assert used[-1] == 2 and used.index(2) <= 8 + 1


def test_a_sudden_slowdown_brings_the_next_try_forward():
    machine = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    choice = ThreadChoice(2, machine.idle_cores)
    run(choice, machine, 1000)  # the tries are now LONGEST_WAIT steps apart
    machine.seconds, machine.idle = {2: 45.0, 1: 2.0}, 0.0
    used = run(choice, machine, 4)
    assert used == [2, 1, 1, 1]


def test_one_core_means_one_thread():
    machine = Machine({1: 1.0}, idle=0.0)
    assert set(run(ThreadChoice(1, machine.idle_cores), machine, 50)) == {1}


def test_idle_cores_reads_the_kernel_counters(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    stat.write_text("cpu  1 0 1 500 0 0\ncpu0 1 0 1 100 0\ncpu1 1 0 1 100 0\ncpu2 0 0 0 900 0\n")
    meter = IdleCores(str(stat))
    ticks = meter._idle_seconds()
    assert ticks == pytest.approx(200 / __import__("os").sysconf("SC_CLK_TCK"))
    assert IdleCores(str(tmp_path / "missing"))() is None
