"""memwall bench: the fields, units and arithmetic of its results (never its timings)."""

import json
import math

import pytest
import torch

from memwall import cost
from memwall.bench import bench_decode, harness, workload
from memwall.cli import main
from memwall.machine import probe as harness_probe
from memwall.specs import ModelSpec

REQUIRED_FIELDS = (
    "engine",
    "device",
    "dtype",
    "prompt_tokens",
    "new_tokens",
    "ttft_ms",
    "ms_per_token",
    "tok_per_s",
    "weight_bytes",
    "kv_bytes",
    "bytes_per_step",
    "measured_bandwidth_bytes_per_s",
    "roofline_tok_per_s",
    "fraction_of_roofline",
)
FAKE_BANDWIDTH = 10e9  # bytes/s: the tests check arithmetic, so no need to measure the machine


def assert_consistent(result, config, prompt_tokens, new_tokens):
    assert result["ms_per_token"] > 0 and result["ttft_ms"] > 0
    assert math.isclose(result["tok_per_s"], 1000 / result["ms_per_token"])
    assert len(result["ms_per_token_repeats"]) >= 1
    spec = ModelSpec.from_hf_config(config)
    assert result["kv_bytes_per_token"] == cost.kv_bytes_per_token(spec, "fp32")
    assert math.isclose(
        result["kv_bytes"], result["kv_bytes_per_token"] * (prompt_tokens + new_tokens / 2)
    )
    assert math.isclose(result["bytes_per_step"], result["weight_bytes"] + result["kv_bytes"])
    bandwidth = result["measured_bandwidth_bytes_per_s"]
    assert math.isclose(result["roofline_tok_per_s"], bandwidth / result["bytes_per_step"])
    assert math.isclose(
        result["fraction_of_roofline"], result["tok_per_s"] / result["roofline_tok_per_s"]
    )
    assert math.isclose(
        result["achieved_bandwidth_bytes_per_s"], result["tok_per_s"] * result["bytes_per_step"]
    )


def test_compare_fields_and_arithmetic(tiny_hf):
    result = bench_decode(
        tiny_hf,
        "compare",
        prompt_tokens=5,
        new_tokens=4,
        repeats=2,
        warmup=0,
        bandwidth=FAKE_BANDWIDTH,
        progress=False,
    )
    json.dumps(result)  # plain JSON types only
    assert result["engine"] == "compare" and result["device"] == "cpu" and result["dtype"] == "fp32"
    for engine in ("memwall", "hf"):
        assert all(field in result[engine] for field in REQUIRED_FIELDS if field not in result)
        assert len(result[engine]["ms_per_token_repeats"]) == 2
        assert_consistent(result[engine], tiny_hf.config, 5, 4)
    assert math.isclose(
        result["memwall_over_hf_tok_per_s"],
        result["memwall"]["tok_per_s"] / result["hf"]["tok_per_s"],
    )
    # Both engines read the same bytes, and the cost model agrees up to the one embedding row a
    # lookup reads (which it leaves out for a tied model, whose table is read whole as the head).
    assert result["memwall"]["weight_bytes"] == result["hf"]["weight_bytes"]
    row_bytes = tiny_hf.config.hidden_size * 4
    assert abs(result["memwall"]["weight_bytes"] - result["cost_model_weight_bytes"]) <= row_bytes


@pytest.mark.parametrize("engine", ["memwall", "hf"])
def test_single_engine_result_is_flat(tiny_hf, engine):
    result = bench_decode(
        tiny_hf,
        engine,
        prompt_tokens=3,
        new_tokens=3,
        repeats=1,
        warmup=1,
        bandwidth=FAKE_BANDWIDTH,
        progress=False,
    )
    assert all(field in result for field in REQUIRED_FIELDS)
    assert result["engine"] == engine and result["new_tokens"] == 3 and result["prompt_tokens"] == 3
    assert_consistent(result, tiny_hf.config, 3, 3)


def test_weight_bytes_of_an_untied_model():
    spec = ModelSpec(
        name="untied",
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=1,
        head_dim=8,
        d_ff=64,
        vocab_size=100,
        tied_embeddings=False,
        max_context=64,
    )
    from memwall.models import random_init

    model = random_init(spec)
    # Every parameter but the input table, plus the one row a token looks up.
    assert workload.hf_weight_bytes_per_step(model) == (spec.n_params - 100 * 32 + 32) * 4
    assert workload.hf_weight_bytes_per_step(model) == cost.weight_bytes(
        spec, "fp32", count_input_embedding=False
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(engine="vllm"), "choose from memwall, hf, compare"),
        (dict(new_tokens=1), "new_tokens"),
        (dict(prompt_tokens=0), "prompt_tokens"),
        (dict(repeats=0), "repeats"),
        (dict(prompt_tokens=250, new_tokens=10), "context of 256"),
    ],
)
def test_bad_arguments_raise_value_errors(tiny_hf, kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench_decode(tiny_hf, **{"bandwidth": FAKE_BANDWIDTH, "progress": False, **kwargs})


def test_options_resolve_with_clear_errors(monkeypatch):
    assert harness.resolve_dtype(None, "cpu") == "fp32"
    # a GPU's default is the 16-bit format it computes in: bf16 from compute capability 8.0 on
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert harness.resolve_dtype(None, "cuda") == "bf16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert harness.resolve_dtype(None, "cuda") == "fp16"  # a T4 emulates bf16
    with pytest.raises(ValueError, match="choose from fp32, bf16, fp16"):
        harness.resolve_dtype("fp8", "cpu")
    for bad in ("tpu", "cpu:0", "cuda:x"):
        with pytest.raises(ValueError, match="choose from cpu, cuda or cuda:N"):
            harness.resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA"):
            harness.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert harness.resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(ValueError, match="sees 1 GPU"):
        harness.resolve_device("cuda:1")
    with pytest.raises(ValueError, match="Unknown model"):
        workload.load_model("random:no-such-model", "fp32", "cpu")


def test_synchronize_waits_for_cuda_only(monkeypatch):
    """The chapters call it around every timed region: a no-op on a CPU, a CUDA sync on a GPU
    (with the device it was given, str or torch.device)."""
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    for device in ("cpu", torch.device("cpu")):
        harness.synchronize(device)
    assert waited == []
    harness.synchronize("cuda")
    harness.synchronize(torch.device("cuda", 1))
    assert waited == ["cuda", torch.device("cuda", 1)]


def test_prompts_have_the_requested_length():
    assert len(workload.make_prompt(40, 1000)) == 40
    assert workload.make_prompt(7, 1000, seed=1) == workload.make_prompt(7, 1000, seed=1)


def test_interleaving_medians_and_warmup():
    calls = []
    runs = {
        name: (lambda name=name: calls.append(name) or {"t": len(calls)}) for name in ("a", "b")
    }
    samples = harness.run_interleaved(runs, repeats=3, warmup=1, progress=False)
    assert calls == ["a", "b"] * 4  # round-robin, warm-up included
    assert [s["t"] for s in samples["a"]] == [3, 5, 7]  # warm-up dropped
    assert harness.medians(samples["a"]) == {"t": 5}


def test_cli_without_a_benchmark_is_a_usage_error(capsys):
    assert main(["bench"]) == 2
    assert "decode" in capsys.readouterr().err
    assert main(["bench", "decode", "--engine", "nope"]) == 2


@pytest.mark.slow
def test_cli_decode_on_smollm2_prints_json(capsys):
    code = main(
        [
            "bench",
            "decode",
            "--model",
            "smollm2-135m",
            "--new-tokens",
            "4",
            "--prompt-tokens",
            "8",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--compare",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"] == "smollm2-135m" and result["device"] == "cpu"
    for engine in ("memwall", "hf"):
        assert all(field in result[engine] or field in result for field in REQUIRED_FIELDS)
        assert result[engine]["measured_bandwidth_bytes_per_s"] > 1e9
    # SmolLM2-135M in fp32: 538 MB of weights read per step, as the cost model says.
    assert abs(result["memwall"]["weight_bytes"] - result["cost_model_weight_bytes"]) <= 576 * 4
    assert 530e6 < result["memwall"]["weight_bytes"] < 545e6


def test_busy_machine_warning(capsys):
    harness.warn_if_busy({"device": "cpu", "threads": 2, "load_average_1min": 5.0})
    assert "load average was 5.0" in capsys.readouterr().err
    harness.warn_if_busy({"device": "cpu", "threads": 2, "load_average_1min": 0.5})
    harness.warn_if_busy({"device": "cuda", "threads": 2, "load_average_1min": 9.0})
    assert capsys.readouterr().err == ""


class FakeProbe:
    """Bandwidths in a fixed cycle, so each repeat's pair is known."""

    def __init__(self, values):
        self.values, self.calls = list(values), 0

    def __call__(self):
        self.calls += 1
        return self.values[(self.calls - 1) % len(self.values)]


def test_fraction_of_roofline_comes_from_adjacent_pairs(tiny_hf):
    probe = FakeProbe([10e9, 20e9])  # warm-up probe 10, then 20, 10, 20 before the timed repeats
    with pytest.warns(harness_probe.RooflineSpreadWarning, match=r"disagreed by 2.00x"):
        result = bench_decode(
            tiny_hf,
            "memwall",
            prompt_tokens=3,
            new_tokens=3,
            repeats=3,
            warmup=1,
            probe=probe,
            progress=False,
        )
    json.dumps(result)
    assert probe.calls == 4
    assert result["bandwidth_probes_bytes_per_s"] == [20e9, 10e9, 20e9]
    assert result["bandwidth_probe_min_bytes_per_s"] == 10e9
    assert result["bandwidth_probe_median_bytes_per_s"] == 20e9
    assert result["bandwidth_probe_max_bytes_per_s"] == 20e9
    assert result["bandwidth_probe_spread"] == 2.0
    assert "2.00x" in result["roofline_warning"]
    expected = [
        (1e3 / ms) / (bw / result["bytes_per_step"])
        for ms, bw in zip(result["ms_per_token_repeats"], [20e9, 10e9, 20e9])
    ]
    assert result["fraction_of_roofline_repeats"] == pytest.approx(expected)
    assert result["fraction_of_roofline"] == pytest.approx(sorted(expected)[1])
    assert result["measured_bandwidth_bytes_per_s"] == 20e9  # the median probe


def test_steady_probes_give_no_warning(tiny_hf, recwarn):
    result = bench_decode(
        tiny_hf,
        "memwall",
        prompt_tokens=3,
        new_tokens=3,
        repeats=2,
        warmup=0,
        probe=FakeProbe([10e9, 11e9]),
        progress=False,
    )
    assert "roofline_warning" not in result
    assert not [w for w in recwarn if w.category is harness_probe.RooflineSpreadWarning]


def test_ceiling_is_the_lower_of_memory_and_compute_roofs(tiny_hf):
    result = bench_decode(
        tiny_hf,
        "memwall",
        prompt_tokens=3,
        new_tokens=3,
        repeats=1,
        warmup=0,
        bandwidth=FAKE_BANDWIDTH,
        peak_flops=1e6,
        progress=False,  # a very slow "chip"
    )
    compute_roof = 1e6 / result["flops_per_token"]
    assert result["compute_roof_tok_per_s"] == pytest.approx(compute_roof)
    assert result["memory_roof_tok_per_s"] == pytest.approx(
        FAKE_BANDWIDTH / result["bytes_per_step"]
    )
    assert result["roofline_tok_per_s"] == pytest.approx(compute_roof)
    assert result["roofline_bound"] == "compute"
    assert result["fraction_of_roofline"] == pytest.approx(result["tok_per_s"] / compute_roof)


def test_real_probe_measures_a_bandwidth():
    # Its buffer size and level follow memwall.machine.working_set (tests/test_machine.py).
    probe = harness_probe.RooflineProbe("cpu", working_set_bytes=64 * 2**20, reads=1)
    assert probe() > 1e8 and len(probe.samples) == 1


def test_every_bench_record_carries_the_machine_fingerprint():
    from memwall.machine.fingerprint import fingerprint_id, machine_fingerprint

    env = harness.environment("cpu")
    assert env["machine"] == machine_fingerprint()
    assert env["machine_id"] == fingerprint_id()


def test_bench_batch_fractions_come_from_probe_pairs(tiny_hf):
    from memwall.bench.batch import bench_batch
    from memwall.hardware import get_hardware

    probe = FakeProbe([10e9, 20e9])
    with pytest.warns(harness_probe.RooflineSpreadWarning):
        result = bench_batch(
            tiny_hf,
            [1, 2],
            context=5,
            new_tokens=2,
            repeats=2,
            warmup=0,
            progress=False,
            hardware=get_hardware("laptop-100gbs"),
            probe=probe,
        )
    json.dumps(result)
    assert probe.calls == 4 and result["bandwidth_probe_spread"] == 2.0
    assert result["bandwidth_probe_median_bytes_per_s"] == 15e9
    for row in result["rows"]:
        assert 0 < row["fraction_of_roofline"] == row["fraction_of_prediction"]
        # The prediction uses this run's median probe, not the catalog's 100 GB/s.
        assert row["predicted_bound"] == "memory"
        assert row["predicted_tok_per_s"] == pytest.approx(
            row["batch"] * 15e9 / row["predicted_bytes_per_step"]
        )


def test_timed_against_roofline_pairs_each_call_with_its_probe():
    calls = []
    probe = FakeProbe([4e9, 8e9])
    with pytest.warns(harness_probe.RooflineSpreadWarning, match="2.00x"):
        result = harness_probe.timed_against_roofline(
            lambda: calls.append(1), bytes_per_call=1e6, repeats=3, warmup=1, probe=probe
        )
    assert len(calls) == 4 and probe.calls == 4
    assert result["bandwidth_probes_bytes_per_s"] == [8e9, 4e9, 8e9]
    expected = [(1 / s) / (bw / 1e6) for s, bw in zip(result["seconds_repeats"], [8e9, 4e9, 8e9])]
    assert result["fraction_of_roofline_repeats"] == pytest.approx(expected)
    assert "roofline_warning" in result
    with pytest.raises(ValueError, match="bytes_per_call"):
        harness_probe.timed_against_roofline(lambda: None, 0, probe=probe)


def test_cli_prints_the_spread_warning_once_on_stderr(monkeypatch, capsys):
    from memwall.bench import decode

    fake = {"engine": "memwall", "tok_per_s": 50.0, "roofline_warning": "probes disagreed by 1.7x"}
    monkeypatch.setattr(decode, "bench_decode", lambda *args, **kwargs: dict(fake))
    assert main(["bench", "decode"]) == 0
    captured = capsys.readouterr()
    assert "disagreed" not in captured.out
    assert captured.err.count("probes disagreed by 1.7x") == 1


def test_a_given_engine_is_timed_and_left_as_it_was(tiny_hf, monkeypatch):
    from memwall.engine import Transformer
    from memwall.engine import model as engine_model

    engine = Transformer.from_hf(tiny_hf)
    before = {name: tensor.clone() for name, tensor in engine.state_dict().items()}
    monkeypatch.setattr(  # no second copy of the weights may be built
        engine_model.Transformer,
        "from_hf",
        classmethod(lambda cls, hf: pytest.fail("bench_decode copied the weights")),
    )
    result = bench_decode(
        tiny_hf,
        "memwall",
        prompt_tokens=3,
        new_tokens=3,
        repeats=1,
        warmup=0,
        bandwidth=FAKE_BANDWIDTH,
        progress=False,
        memwall_model=engine,
        quant="int8",
    )
    assert result["tok_per_s"] > 0
    after = engine.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_transformers_is_timed_over_every_token_asked_for(tiny_hf):
    # generate fills an end-of-text token left None from the model's own generation config:
    # when greedy decoding meets it, generate stops early, and the timing had too few tokens.
    from memwall.bench.decode import time_hf

    prompt = [5, 6, 7, 8]
    with torch.inference_mode():
        first = int(tiny_hf(torch.tensor([prompt])).logits[0, -1].argmax())
    saved = tiny_hf.generation_config.eos_token_id
    tiny_hf.generation_config.eos_token_id = first  # the very first token ends the text
    try:
        assert time_hf(tiny_hf, prompt, 6)["tpot_s"] > 0
        assert tiny_hf.generation_config.eos_token_id == first  # the model's own config kept
    finally:
        tiny_hf.generation_config.eos_token_id = saved
