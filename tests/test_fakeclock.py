"""memwall.fakeclock: pretend machines for the measured exercises, built from plain data."""

import json

import pytest

from memwall.exercise_driver.values import remote_handle, to_plain
from memwall.fakeclock import bench_spec, build, build_case


def timed(bench, work, *args):
    start = bench.clock()
    getattr(bench, work)(*args)
    return bench.clock() - start


def test_a_quiet_machine_gives_the_true_times():
    bench = build("ab", {"a_s": 0.01, "b_s": 0.03})
    assert timed(bench, "run_a") == pytest.approx(0.01)
    assert timed(bench, "run_b") == pytest.approx(0.03)
    assert bench.clock() == pytest.approx(0.04)


def test_warm_up_drift_and_jumps_stretch_the_work():
    machine = {
        "warmup_calls": 1,
        "warmup_factor": 4.0,
        "drift_per_s": 1.0,
        "jumps": [[2.0, 3.0, 2.0]],
    }
    bench = build("ab", {"machine": machine, "a_s": 1.0, "b_s": 1.0})
    assert 2.4 <= timed(bench, "run_a") <= 5.6  # warm-up: 4x, drawn 0.6-1.4 times that
    later = timed(bench, "run_a")  # drift: slower as fake time passes (and in the jump)
    assert later > 1.0


def test_the_same_spec_builds_the_same_machine():
    spec = {"machine": {"seed": 7, "noise": 0.05, "outlier_rate": 0.2, "outlier_factor": 3.0},
            "a_s": 0.01, "b_s": 0.02}  # fmt: skip
    first, second = build("ab", spec), build("ab", spec)
    assert [timed(first, "run_a") for _ in range(20)] == [timed(second, "run_a") for _ in range(20)]


def test_the_cache_keeps_the_last_buffer_that_fits():
    bench = build("cache_sweep", {"cache_bytes": 1000, "cache_gb_s": 100.0, "memory_gb_s": 10.0})
    assert timed(bench, "read", 800) == pytest.approx(800 / 10e9)  # first read: from memory
    assert timed(bench, "read", 800) == pytest.approx(800 / 100e9)  # again: from the cache
    timed(bench, "read", 400)  # another size evicts it
    assert timed(bench, "read", 800) == pytest.approx(800 / 10e9)
    timed(bench, "read", 4000)
    assert timed(bench, "read", 4000) == pytest.approx(4000 / 10e9)  # too big to be cached


def test_steps_follow_their_cost_models():
    kv = build("kv_steps", {"weights_s": 0.01, "s_per_token": 1e-6})
    assert timed(kv, "step", 1000) == pytest.approx(0.011)
    batch = build(
        "batch_steps", {"weights_s": 0.01, "kv_s_per_user": 0.0, "compute_s_per_user": 0.001}
    )
    assert timed(batch, "step", 4) == pytest.approx(0.01)  # memory-bound: weights once
    assert timed(batch, "step", 40) == pytest.approx(0.04)  # compute-bound
    formats = build("formats", {"seconds_by_format": {"fp32": 0.02, "int8": 0.006}})
    assert timed(formats, "matvec", "int8") == pytest.approx(0.006)


@pytest.mark.parametrize(
    "kind, spec, message",
    [("nope", {}, "unknown bench kind"), ("kv_steps", {"weights_s": 1, "s_per_token": 1}, None)],
)
def test_bad_specs_and_arguments_raise_clear_errors(kind, spec, message):
    if message:
        with pytest.raises(ValueError, match=message):
            build(kind, spec)
    else:
        with pytest.raises(ValueError, match="context must be an integer >= 1"):
            build(kind, spec).step(0)
    with pytest.raises(ValueError, match="unknown format"):
        build("formats", {"seconds_by_format": {"fp32": 1.0}}).matvec("int3")


def test_a_case_is_plain_json_and_its_bench_stays_on_the_graders_side():
    case = {"bench": bench_spec("ab", a_s=0.01, b_s=0.02), "repeats": 5}
    assert json.loads(json.dumps(case)) == case
    built = build_case(case)
    assert built["repeats"] == 5 and timed(built["bench"], "run_b") == pytest.approx(0.02)
    # over the grading channel a bench is a handle to its public methods, not its data
    handle = to_plain(built["bench"], remote=lambda value: remote_handle(0, value))
    assert handle["methods"] == ["clock", "run_a", "run_b"] and handle["attributes"] == []
    assert "0.02" not in json.dumps(handle)


def test_a_verify_pass_costs_one_step_plus_its_guesses():
    bench = build("verify", {"decode_s": 0.01, "extra_s_per_guess": 0.002})
    assert timed(bench, "decode") == pytest.approx(0.01)
    assert timed(bench, "verify", 4) == pytest.approx(0.018)


def test_a_run_of_steps_starts_slow():
    bench = build("steps", {"machine": {"warmup_calls": 3, "warmup_factor": 5.0}, "step_s": 0.01})
    times = [timed(bench, "step") for _ in range(6)]
    assert all(t > 0.02 for t in times[:3]) and times[3:] == pytest.approx([0.01] * 3)
