"""The fused step's thread count: chosen from the steps' own times, tried rarely, never spinning
two threads against a core another process holds."""

import os
import time

import pytest

from memwall.machine.step_threads import LONGEST_WAIT, BusyElsewhere, IdleCores, ThreadChoice


class Machine:
    """A pretend machine: a step takes `seconds[threads]`; `idle` cores beside the step, `busy`
    cores' worth of other processes' work (None: the kernel's counters cannot be read)."""

    def __init__(self, seconds, idle, busy=None):
        self.seconds, self.idle = dict(seconds), idle
        self.busy = busy if busy is not None else 1.0 - idle

    def idle_cores(self):
        return self.idle

    def busy_elsewhere(self):
        return self.busy

    def choice(self, most=2):
        return ThreadChoice(most, self.idle_cores, self.busy_elsewhere)


def run(choice, machine, steps):
    used = []
    for _ in range(steps):
        threads = choice.threads()
        used.append(threads)
        choice.record(threads, machine.seconds[threads])
    return used


def test_a_quiet_machine_keeps_every_thread_and_never_tries_one():
    machine = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    assert set(run(machine.choice(), machine, 2000)) == {2}


def test_without_the_kernels_counters_one_thread_is_tried_rarely():
    machine = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    used = run(ThreadChoice(2, lambda: None, lambda: None), machine, 2000)
    tries = used.count(1)
    assert used[0] == 2 and 1 <= tries <= 12  # waits double: 8, 16, ... up to LONGEST_WAIT


def test_a_slower_try_under_load_makes_the_next_wait_longer():
    machine = Machine({2: 1.0, 1: 1.8}, idle=0.0, busy=0.6)  # busy, yet two threads still win
    used = run(machine.choice(), machine, 2000)
    assert 1 <= used.count(1) <= 12


def test_a_busy_core_sends_the_step_to_one_thread_at_once():
    machine = Machine({2: 45.0, 1: 2.0}, idle=0.0)
    used = run(machine.choice(), machine, 500)
    assert used[:3] == [2, 1, 1]  # one slow step, then one thread
    assert used.count(2) == 1  # the other core stays taken: two threads are never tried again


def test_the_step_goes_back_to_every_thread_when_the_core_is_free_again():
    machine = Machine({2: 45.0, 1: 2.0}, idle=0.0)
    choice = machine.choice()
    run(choice, machine, 100)
    machine.seconds, machine.idle, machine.busy = {2: 1.0, 1: 1.8}, 1.0, 0.0
    used = run(choice, machine, LONGEST_WAIT + 10)
    assert used[-1] == 2 and used.index(2) <= 8 + 1


def test_a_sudden_slowdown_brings_the_next_try_forward():
    machine = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    choice = machine.choice()
    run(choice, machine, 1000)  # the tries are now LONGEST_WAIT steps apart
    machine.seconds, machine.idle, machine.busy = {2: 45.0, 1: 2.0}, 0.0, 1.0
    used = run(choice, machine, 4)
    assert used == [2, 1, 1, 1]


def test_one_core_means_one_thread():
    machine = Machine({1: 1.0}, idle=0.0)
    assert set(run(machine.choice(1), machine, 50)) == {1}


def test_idle_cores_reads_the_kernel_counters(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    stat.write_text("cpu  1 0 1 500 0 0\ncpu0 1 0 1 100 0\ncpu1 1 0 1 100 0\ncpu2 0 0 0 900 0\n")
    meter = IdleCores(str(stat))
    ticks = meter._idle_seconds()
    assert ticks == pytest.approx(200 / __import__("os").sysconf("SC_CLK_TCK"))
    assert IdleCores(str(tmp_path / "missing"))() is None


@pytest.fixture
def clock(monkeypatch):
    """Two cores, no child processes, and a wall clock and CPU-time clock the test sets."""
    clock = {"wall": 10.0, "own": 3.0}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("memwall.machine.step_threads._children_cpu_seconds", lambda: 0.0)
    monkeypatch.setattr("time.monotonic", lambda: clock["wall"])
    monkeypatch.setattr("time.process_time", lambda: clock["own"])
    return clock


def test_busy_elsewhere_is_the_cores_busy_time_less_this_process(clock):
    idle = iter([0.2, None])
    meter = BusyElsewhere(lambda: next(idle))
    clock["wall"], clock["own"] = 11.0, 4.0  # one second: 0.2 cores idle, one core this process
    assert meter() == pytest.approx(0.8)  # 2 cores - 0.2 idle - 1.0 own
    clock["wall"] = 12.0
    assert meter() is None  # the counters could not be read


def test_a_look_too_short_for_the_kernels_ticks_sees_nobody_and_waits_for_a_longer_one(clock):
    from memwall.machine.step_threads import SHORTEST_LOOK

    looks = []
    meter = BusyElsewhere(lambda: looks.append(clock["wall"]) or 0.0)
    # 40 ms, one core busy in this process and no tick of idle time counted yet: no others seen
    clock["wall"], clock["own"] = 10.04, 3.04
    assert meter() == 0.0 and looks == []
    # the look that counts spans from 10.0: the whole second, one core this process's, none idle
    clock["wall"], clock["own"] = 10.0 + max(1.0, SHORTEST_LOOK), 4.0
    assert meter() == pytest.approx(1.0) and len(looks) == 1


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's /proc only")
def test_the_cpu_time_of_a_process_this_one_started_counts_as_its_own():
    """A chapter's own client processes are its work: a busy child is not "another program"."""
    import subprocess
    import sys

    from memwall.machine.step_threads import _children_cpu_seconds

    before = _children_cpu_seconds()
    burn = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", burn + "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while _children_cpu_seconds() - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        running = _children_cpu_seconds() - before  # read while the child still runs
    finally:
        child.communicate(b"")
    assert running >= 0.3
    assert _children_cpu_seconds() - before >= 0.3  # and once it has ended


def test_steps_on_fewer_threads_are_noted_for_the_verdicts():
    from memwall.machine.cpu_wait import CpuWait

    span = CpuWait()
    quiet = Machine({2: 1.0, 1: 1.8}, idle=1.0)
    run(quiet.choice(), quiet, 200)
    assert span.fewer_thread_steps() == 0
    busy = Machine({2: 30.0, 1: 2.0}, idle=0.0)
    used = run(busy.choice(), busy, 50)
    assert span.fewer_thread_steps() == used.count(1) > 40


class OneThreadChoice:
    """A chooser that always asks for one thread, and remembers what it was told."""

    made = []

    def __init__(self, most):
        self.most, self.recorded = most, []
        OneThreadChoice.made.append(self)

    def threads(self):
        return 1

    def record(self, threads, seconds):
        self.recorded.append((threads, seconds))


@pytest.fixture
def two_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_readable_engines_steps_take_the_chosen_threads_and_give_them_back(
    tiny_engine, two_threads, monkeypatch
):
    import copy

    import torch

    from memwall.machine import step_threads

    OneThreadChoice.made.clear()
    monkeypatch.setattr(step_threads, "ThreadChoice", OneThreadChoice)
    monkeypatch.setattr(step_threads, "usable_cores", lambda: 2)
    model = copy.deepcopy(tiny_engine)  # its own choices, as any copy of a model
    seen = []
    watch = model.blocks[0].register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    plain = {"pre": dict(model._forward_pre_hooks), "post": dict(model._forward_hooks)}
    cache = model.new_cache(batch=1, max_tokens=8)
    model(torch.tensor([[1, 2, 3]]), cache)  # a prompt: left on every thread
    step = model(torch.tensor([[4]]), cache)
    assert seen == [2, 1] and torch.get_num_threads() == 2
    (choice,) = OneThreadChoice.made
    assert choice.most == 2 and [t for t, _ in choice.recorded] == [1]
    assert choice.recorded[0][1] > 0
    # the hooks change only the thread count: the same logits without them
    model._forward_pre_hooks.clear(), model._forward_hooks.clear()
    again = model.new_cache(batch=1, max_tokens=8)
    model(torch.tensor([[1, 2, 3]]), again)
    torch.testing.assert_close(model(torch.tensor([[4]]), again), step)
    model._forward_pre_hooks.update(plain["pre"]), model._forward_hooks.update(plain["post"])
    # a step that fails still gives the threads back
    with pytest.raises(IndexError):  # a position past the rotary table
        model(torch.tensor([[5]]), cache, positions=torch.tensor([[10**6]]))
    assert torch.get_num_threads() == 2
    watch.remove()
