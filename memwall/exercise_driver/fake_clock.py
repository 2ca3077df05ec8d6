"""A fake clock and a workload timed with it: the example builder for measured exercises.

``build_spec("fake_clock_workload", step_times_s=[0.01, 0.012, 0.5])`` becomes a
``FakeClockWorkload``: ``clock()`` reads the fake time, ``run_step()`` runs the next step and
advances the clock by that step's time. A student's measuring function gets one and must time
it only with ``clock()``, so its result is exact and the same on every machine.
"""

from memwall.exercise_driver.builders import builder


class FakeClockWorkload:
    served_remotely = True  # under `memwall grade` it stays in the grader (see values.py)

    def __init__(self, step_times_s, start_s=0.0):
        self._step_times_s = [float(t) for t in step_times_s]
        self._now_s = float(start_s)
        self._next = 0

    @property
    def n_steps(self) -> int:
        return len(self._step_times_s)

    def clock(self) -> float:
        """The fake time in seconds (a stand-in for time.perf_counter())."""
        return self._now_s

    def run_step(self):
        """Run the next step: the clock moves on by its time."""
        if self._next >= len(self._step_times_s):
            raise RuntimeError(f"the workload has only {len(self._step_times_s)} steps")
        self._now_s += self._step_times_s[self._next]
        self._next += 1

    def __repr__(self):
        return f"FakeClockWorkload({self.n_steps} steps)"


@builder("fake_clock_workload")
def build_fake_clock_workload(spec):
    step_times = spec.get("step_times_s")
    if not isinstance(step_times, list) or not all(
        isinstance(t, (int, float)) and t >= 0 for t in step_times
    ):
        raise ValueError("fake_clock_workload needs step_times_s: a list of times >= 0")
    return FakeClockWorkload(step_times, spec.get("start_s", 0.0))
