"""Shared pieces of the measured exercises' checks (chapters 3, 4, 6, 7, 8 and 9).

Each measured check is three separable parts, so the grader can run them on its own side:
(a) a case generator that draws plain data from the rng: keyword arguments, one of which is a
``memwall.fakeclock.bench_spec`` describing a pretend machine; (b) a reference that computes
the machine's truth from that plain data; (c) a comparison of the student's result with it.
Only the student's call builds the bench (``memwall.fakeclock.build_case``). Under
``memwall grade`` the bench stays in the grader: the student's function gets a stand-in whose
calls come back over the channel (``grading.channel.RemoteFunction``).
"""

from memwall.fakeclock import build_case, is_bench_spec
from memwall.grading.compare import difference, show


def compare_measured(student, reference, cases, rtol, atol=0.0) -> int:
    """Call ``student(**built case)`` on each case; compare with ``reference(**case)``."""
    __tracebackhide__ = True
    if not callable(student):
        raise AssertionError(f"expected a function, got {type(student).__name__}")
    cases = list(cases)
    for number, case in enumerate(cases, 1):
        expected = reference(**case)
        try:
            got = call_student(student, case)
        except NotImplementedError:
            raise
        except Exception as error:
            raise AssertionError(
                f"{describe(student, case)} raised {type(error).__name__}: {error}"
            ) from None
        problem = difference(expected, got, rtol=rtol, atol=atol)
        if problem:
            raise AssertionError(
                f"{describe(student, case)} measured the wrong thing: {problem} "
                f"(case {number} of {len(cases)}{machine_note(case)})"
            )
    return len(cases)


def call_student(student, case):
    """The student's result on freshly built benches: called here, or over the grading channel,
    where the benches stay on this side and the student's kernel gets stand-ins."""
    built = build_case(case)
    if hasattr(student, "call_plain"):
        return student.call_plain((), built)
    return student(**built)


def describe(student, case) -> str:
    name = getattr(student, "__name__", "your function")
    shown = [
        f"{key}=<bench>" if is_bench_spec(value) else f"{key}={show(value)}"
        for key, value in case.items()
    ]
    return f"{name}({', '.join(shown)})"


def machine_note(case) -> str:
    """What makes this case's pretend machine hard to time, in words."""
    for value in case.values():
        if is_bench_spec(value):
            machine = value["spec"].get("machine", {})
            traits = [
                ("noise", "noise"),
                ("outlier_rate", "slow outliers"),
                ("warmup_calls", "slow first calls"),
                ("drift_per_s", "a speed that drifts"),
                ("jumps", "spells at another speed"),
            ]
            present = [words for key, words in traits if machine.get(key)]
            if present:
                return "; the pretend machine has " + ", ".join(present)
    return ""


def noisy_machine(rng, seed_bits=32, **extra) -> dict:
    """The usual pretend machine: 2-3% jitter, 1-3% slow outliers, slow first calls."""
    machine = dict(
        seed=rng.getrandbits(seed_bits),
        noise=rng.uniform(0.015, 0.03),
        outlier_rate=rng.uniform(0.01, 0.03),
        outlier_factor=rng.uniform(2.5, 5.0),
        warmup_calls=2,
        warmup_factor=rng.uniform(3.0, 5.0),
    )
    machine.update(extra)
    return machine


def drifting(rng, run_s) -> dict:
    """A slow drift over the run (20-35% slower by its end) and one spell of a slower level."""
    start = rng.uniform(0.1, 0.6) * run_s
    return dict(
        drift_per_s=rng.uniform(0.2, 0.35) / run_s,
        jumps=[[start, start + rng.uniform(0.1, 0.25) * run_s, rng.uniform(1.3, 1.8)]],
    )
