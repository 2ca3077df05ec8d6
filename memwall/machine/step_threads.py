"""How many threads a decode step uses, chosen from the steps' own times.

A decode step (the fast path's fused C step, or the readable engine's) is a few hundred parallel
pieces, each ending at a barrier where every thread waits for the slowest. When another process
holds one of the cores, the thread that shares that core runs only when the scheduler gives it a
turn (milliseconds later), and every barrier pays for the wait: two threads can then be tens of
times slower than one. Load averages cannot say this in time (they lag by a minute, and in a
container they describe the host), so the step measures: it runs on all its threads, tries one
thread now and then, and keeps whichever was faster.

- A try that loses waits twice as long before the next one, so a machine whose load stays put
  pays for the tries less and less; a try that wins switches at once.
- A step much slower than the recent ones (another process just started) brings the next try
  forward to the next step.
- Trying more threads while others hold the cores costs a very slow step, so it is tried only
  when the kernel's counters say that the other cores were idle for at least half a core's time
  since the last look (`/proc/stat`; where it cannot be read, the doubling wait alone decides).
- Trying fewer threads on a quiet machine costs a slow step too (one core streams the weights at
  a fraction of the bandwidth), so it is tried only when other processes took at least half a
  core's time since the last look: the cores' busy time less this process's own and that of the
  processes it started (a chapter's own clients are part of its experiment, not a disturbance).

A step on fewer threads than the machine has is noted (`memwall.machine.cpu_wait`), so a verdict
never reads its time as the quiet machine's.

The readable engine meets the same waits: its one-token steps are hundreds of small PyTorch ops,
each a parallel region of PyTorch's threads. `choose_step_threads(model)` gives its one-token CPU
steps the same choice, through forward hooks that set PyTorch's thread count for the step and
restore it after, so that the model's own code stays as the textbook writes it.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import weakref
from collections import deque
from pathlib import Path

import torch

from memwall.machine.cores import usable_cores
from memwall.machine.cpu_wait import note_fewer_threads

FIRST_TRY = 8  # steps before the other thread count is tried again after a switch
LONGEST_WAIT = 256  # steps between tries at most: how late a change of load is noticed
CLEAR_WIN = 0.9  # a try replaces the current count when it takes under 0.9 of its time
SUDDEN = 2.0  # a step this many times the recent median brings the next try forward
RECENT = 5  # steps whose median stands for the current count
IDLE_TO_TRY = 0.5  # idle cores (beside this step's own) needed before more threads are tried
BUSY_TO_TRY = 0.5  # cores' worth of other processes' work needed before fewer threads are tried
# The kernel counts idle time in ticks (usually 10 ms): over a look of a few steps, a tick more or
# less reads as a core's fifth, and this process's own time (counted in nanoseconds) set against it
# would show other processes that are not there. A look spans at least this long.
SHORTEST_LOOK = 0.25  # seconds


class IdleCores:
    """How many of the cores this process may use sat idle, on average, since the last call."""

    def __init__(self, stat_path: str = "/proc/stat"):
        self.path = stat_path
        self.cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        self.last = (time.monotonic(), self._idle_seconds())

    def _idle_seconds(self) -> float | None:
        try:
            with open(self.path) as stat:
                lines = [line.split() for line in stat if line.startswith("cpu")]
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        # fields after the name: user nice system idle iowait ...
        return sum(int(f[4]) + int(f[5]) for f in lines if f[0] in self.cpus) / ticks

    def __call__(self) -> float | None:
        now, idle = time.monotonic(), self._idle_seconds()
        then, before = self.last
        if idle is None or before is None:
            self.last = (now, idle)
            return None
        if now - then < SHORTEST_LOOK:
            return 0.0  # too short to tell: no idle core seen yet; the next look spans longer
        self.last = (now, idle)
        return (idle - before) / (now - then)


def _children_cpu_seconds() -> float:
    """CPU seconds of the processes this one started, ended or running: work it asked for (a
    chapter's own client processes), not another program's."""
    times = os.times()
    total = times.children_user + times.children_system  # those already ended
    ticks = os.sysconf("SC_CLK_TCK")
    for pid in _running_children():
        try:
            # after the name in parentheses: state, ppid ... utime and stime are the 12th and 13th
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue  # it ended between the listing and the read: os.times counts it now
    return total


def _running_children() -> list[str]:
    pids = []
    try:
        for task in os.listdir("/proc/self/task"):
            pids += Path(f"/proc/self/task/{task}/children").read_text().split()
    except OSError:
        pass
    return pids


class BusyElsewhere:
    """How many cores' worth of time other processes took, on average, since the last call: the
    cores this process may use, less their idle time, this process's own CPU time and that of the
    processes it started."""

    def __init__(self, idle_cores=None):
        self.idle_cores = idle_cores or IdleCores()
        self.cores = len(os.sched_getaffinity(0))
        self.last = (time.monotonic(), self._own())

    @staticmethod
    def _own() -> float:
        return time.process_time() + _children_cpu_seconds()

    def __call__(self) -> float | None:
        now = time.monotonic()
        then, before = self.last
        if now - then < SHORTEST_LOOK:
            return 0.0  # too short to tell: nobody else seen yet; the next look spans longer
        idle, own = self.idle_cores(), self._own()
        self.last = (now, own)
        if idle is None:
            return None
        return max(0.0, self.cores - idle - (own - before) / (now - then))


class ThreadChoice:
    """The thread count of each step: `threads()` before it, `record(threads, seconds)` after."""

    def __init__(self, most: int, idle_cores=None, busy_elsewhere=None):
        self.most = self.current = max(1, most)
        self.other = 1 if self.current > 1 else None
        self.idle_cores = idle_cores or IdleCores()
        self.busy_elsewhere = busy_elsewhere or BusyElsewhere()
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.wait, self.countdown = FIRST_TRY, 1  # the first try comes right after one step

    def threads(self) -> int:
        if self.other is None or self.countdown > 0 or not self.recent:
            return self.current
        if self.other > self.current:
            idle = self.idle_cores()
            if idle is not None and idle < IDLE_TO_TRY:
                self.countdown = self.wait  # the other cores are taken: no try this time
                return self.current
        else:
            busy = self.busy_elsewhere()
            if busy is not None and busy < BUSY_TO_TRY:
                # nobody else wants the cores: no try, and a fresh look soon (a look is cheap)
                self.countdown = FIRST_TRY
                return self.current
        return self.other

    def record(self, threads: int, seconds: float) -> None:
        if threads < self.most:  # a smaller machine than the quiet one: verdicts must know
            note_fewer_threads()
        if threads == self.current:
            if self.recent and seconds > SUDDEN * statistics.median(self.recent):
                self.recent.clear()  # the older steps no longer describe this machine
                self.countdown = 0
            else:
                self.countdown -= 1
            self.recent.append(seconds)
            return
        tried_more = threads > self.current
        if seconds < CLEAR_WIN * statistics.median(self.recent):
            self.current, self.other = threads, self.current
            self.recent.clear()
            self.recent.append(seconds)
            self.wait = FIRST_TRY
        else:
            self.wait = min(2 * self.wait, LONGEST_WAIT)
        self.countdown = self.wait
        # the next look at the cores' use starts after this try
        (self.idle_cores if tried_more else self.busy_elsewhere)()


# ---- the readable engine's steps ------------------------------------------------------------------


class _StepThreads:
    """A model's thread choices, one per (rows, PyTorch's thread count): steps of different
    batches take different times. And the steps under way, one per calling thread."""

    def __init__(self):
        self.choices: dict[tuple[int, int], ThreadChoice] = {}
        self.steps: dict[int, tuple] = {}  # thread id: (choice, threads, PyTorch's count, start)


# Kept beside the models, not in them: a copy (quantize(inplace=False)) keeps the hooks but starts
# its own choices, since its steps take other times.
_STEP_THREADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def choose_step_threads(model: torch.nn.Module) -> torch.nn.Module:
    """Run `model`'s one-token CPU steps on the thread count a `ThreadChoice` picks from their
    times; other calls (prompts, verification, a GPU, a compiled step) are left as they are."""
    model.register_forward_pre_hook(_before_step, with_kwargs=True)
    model.register_forward_hook(_after_step, with_kwargs=True, always_call=True)
    return model


def _before_step(model, args, kwargs):
    if torch.compiler.is_compiling():
        return
    tokens = args[0] if args else kwargs.get("tokens")
    if not (
        isinstance(tokens, torch.Tensor)
        and tokens.device.type == "cpu"
        and tokens.dim() == 2
        and tokens.shape[1] == 1
    ):
        return
    state = _STEP_THREADS.setdefault(model, _StepThreads())
    usual = torch.get_num_threads()
    key = (tokens.shape[0], usual)
    if key not in state.choices:
        state.choices[key] = ThreadChoice(min(usual, usable_cores()))
    choice = state.choices[key]
    threads = choice.threads()
    if threads != usual:
        torch.set_num_threads(threads)
    state.steps[threading.get_ident()] = (choice, threads, usual, time.perf_counter())


def _after_step(model, args, kwargs, output):
    if torch.compiler.is_compiling():
        return
    state = _STEP_THREADS.get(model)
    step = state and state.steps.pop(threading.get_ident(), None)
    if step is None:
        return
    choice, threads, usual, start = step
    if threads != usual:
        torch.set_num_threads(usual)
    choice.record(threads, time.perf_counter() - start)
