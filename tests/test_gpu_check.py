"""benchmarks/gpu_check.py, the one run a GPU session makes: its dry run on the CPU must go end to
end and write the keys issue 35 asks for, and a CUDA graph skipped during a section or a chapter
(the step then launch-bound, said only in torch's log) must reach the record and its summary."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ISSUE_KEYS = {
    "device_name", "copy_bandwidth_gbps", "bf16_b1_fraction_of_bandwidth",
    "int8_speedup_over_bf16", "int4_speedup_over_bf16", "b64_fraction_of_ceiling",
    "vs_hf_static_compiled", "vs_hf_eager", "chapters_on_cuda_ok",
}  # fmt: skip


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def dry_run(gpu_check, tmp_path_factory, monkeypatch):
    """gpu_check.main, whose dry run takes one core: the thread count restored after the test;
    no record of this checkout's (a dry run of a developer's) to add to."""
    monkeypatch.setattr(gpu_check, "COMMITTED", tmp_path_factory.mktemp("committed"))
    threads = torch.get_num_threads()
    yield gpu_check.main
    torch.set_num_threads(threads)


def test_the_dry_run_writes_every_key_and_checks_what_it_times(dry_run, tmp_path):
    status = dry_run(["--allow-cpu", "--sections", "speed,server", "--results-dir", str(tmp_path)])
    [path] = tmp_path.glob("gpu_check-*.json")
    record = json.loads(path.read_text())
    summary = record["summary"]
    assert status == 0 and ISSUE_KEYS <= set(summary)
    assert summary["correctness_ok"] and summary["server_greedy_identical"]
    assert summary["chapters_on_cuda_ok"] is None  # a dry run does not run the book
    for label in ("readable_eager", "compiled", "compiled_int8", "compiled_int4"):
        assert record["decode"][label]["tok_per_s"] > 0
    assert summary["cudagraph_skips"] == 0 and "| CUDA graphs skipped" in record["markdown"]


def test_a_cuda_graph_warning_reaches_the_record(gpu_check):
    # torch's own emitter: its logger is `cudagraphs_log` in newer releases, the performance
    # hints in older ones (2.5)
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    record, budget = {}, gpu_check.Budget(60, None)
    gpu_check.section(record, "server", budget, lambda: {"rows": []})
    assert "cudagraph_warnings" not in record["server"]
    skipped = "skipping cudagraphs due to mutated inputs (2 instances)"
    gpu_check.section(
        record, "server", budget, lambda: log_cudagraph_skip_and_bump_counter(skipped) or {}
    )
    assert record["server"]["cudagraph_warnings"] == [skipped]
    record["chapters"] = {"cudagraph_warnings_by_chapter": {"04_kv_cache.md": [
        f"W1207 cudagraph_utils.py:380] [__cudagraphs] {skipped}",
        "W1207 cudagraph_utils.py:510] [__cudagraphs] CUDAGraph supports dynamic shapes by ...",
    ]}}  # fmt: skip
    assert gpu_check.summary(record)["cudagraph_skips"] == 2  # the section's and a chapter's


def test_resume_keeps_what_an_earlier_call_measured_and_finishes_the_rest(dry_run, tmp_path):
    # A call cut short by its time limit: roofs, correctness and part of decode and the batches
    # measured (marked values, which a second measurement would replace), a graph skipped while
    # decode ran, the peers not started.
    from memwall.bench.records import save_record

    skipped_graph = "skipping cudagraphs due to mutated inputs (2 instances)"

    earlier = {
        "device": "cpu", "device_name": "cpu (dry run)", "dtype": "bf16", "speed_model": "tiny",
        "roofs": {"copy_bandwidth_gbps": 1234.0, "matmul_tflops": 5.0},
        "correctness": {"ok": True},
        "decode": {label: {"tok_per_s": 777.0} for label in ("readable_eager", "compiled")}
        | {"compiled_int8": {"tok_per_s": 888.0}, "compiled_int4": {"skipped": "time budget spent"},
           "cudagraph_warnings": [skipped_graph]},
        "batches": {"context": 32, "new_tokens": 4, "skipped_from_batch": 2,
                    "rows": [{"batch": 1, "step_s": 9.0, "tok_per_s": 0.11, "ceiling_tok_per_s": 1.0,
                              "fraction_of_ceiling": 0.11, "bound": "memory"}]},
        "peers": {"skipped": "time budget spent"},
    }  # fmt: skip
    save_record(earlier, "gpu_check", tmp_path)
    args = ["--allow-cpu", "--sections", "speed", "--results-dir", str(tmp_path), "--resume"]
    assert dry_run(args) == 0
    [path] = tmp_path.glob("gpu_check-*.json")
    record = json.loads(path.read_text())
    assert record["roofs"]["copy_bandwidth_gbps"] == 1234.0 and record["correctness"] == {
        "ok": True
    }
    assert record["decode"]["compiled"]["tok_per_s"] == 777.0
    assert record["decode"]["compiled_int8"]["tok_per_s"] == 888.0
    assert record["decode"]["compiled_int4"]["tok_per_s"] > 0  # the skipped label, measured now
    assert [row["batch"] for row in record["batches"]["rows"]] == [1, 2, 3]
    assert record["batches"]["rows"][0]["step_s"] == 9.0
    assert "skipped_from_batch" not in record["batches"]
    assert "skipped" not in record["peers"]
    assert all(record["peers"][label]["tok_per_s"] > 0 for label in ("hf_eager", "hf_static"))
    assert record["summary"]["int8_speedup_over_bf16"] == 888.0 / 777.0
    assert record["decode"]["cudagraph_warnings"] == [skipped_graph]  # it concerns kept results
    assert record["summary"]["cudagraph_skips"] == 1

    # Out of time at once: nothing measured is lost to a "skipped" mark.
    assert dry_run([*args, "--budget-s", "0"]) == 0
    again = json.loads(path.read_text())
    for part in ("roofs", "correctness", "decode", "batches", "peers"):
        assert again[part] == record[part]


def test_resume_leaves_a_record_measured_otherwise_and_starts_its_own(dry_run, tmp_path):
    # A record carried from an earlier session whose image had another torch, say: its numbers
    # and this run's would not compare, and the call must not be lost either.
    from memwall.bench.records import save_record

    earlier = {"device": "cpu", "speed_model": "llama-3-8b", "date": "2026-12-01T10:00"}
    path = save_record(earlier, "gpu_check", tmp_path)
    before = path.read_text()
    args = ["--allow-cpu", "--sections", "speed", "--results-dir", str(tmp_path), "--resume"]
    assert dry_run(args) == 0 and path.read_text() == before  # tiny here: nothing mixed in
    [new] = set(tmp_path.glob("gpu_check-*.json")) - {path}
    assert json.loads(new.read_text())["speed_model"] == "tiny"


def test_resume_adds_to_a_record_committed_from_an_earlier_session(dry_run, gpu_check, tmp_path):
    # A session's device time ends before the check does; the next session on the same kind of
    # GPU carries the committed record in the working tree and writes the continuation to $OUT.
    from memwall.bench.records import save_record

    earlier = {"device": "cpu", "device_name": "cpu (dry run)", "dtype": "bf16",
               "speed_model": "tiny", "date": "2026-12-01T10:00",
               "roofs": {"copy_bandwidth_gbps": 1234.0, "matmul_tflops": 5.0}}  # fmt: skip
    committed = save_record(earlier, "gpu_check", gpu_check.COMMITTED)
    before = committed.read_text()
    out = tmp_path / "out"
    args = ["--allow-cpu", "--sections", "speed", "--results-dir", str(out), "--resume"]
    assert dry_run([*args, "--budget-s", "0"]) == 0
    continued = out / committed.name  # the same name: the same record, carried on
    record = json.loads(continued.read_text())
    assert record["roofs"]["copy_bandwidth_gbps"] == 1234.0 and committed.read_text() == before
    # The session's next call adds to its own continuation, not to the committed record again.
    record["correctness"] = {"ok": True, "marked": "measured by this session's first call"}
    continued.write_text(json.dumps(record))
    assert dry_run([*args, "--budget-s", "0"]) == 0
    assert json.loads(continued.read_text())["correctness"]["marked"]


def test_a_check_left_for_a_later_call_is_not_a_failure(dry_run, gpu_check, tmp_path, monkeypatch):
    # Out of time before the server's section (or any): nothing failed, so the call exits 0,
    # and the record saved along the way carries its summary and table.
    args = ["--allow-cpu", "--sections", "speed,server", "--results-dir", str(tmp_path)]
    assert dry_run([*args, "--budget-s", "0"]) == 0
    [path] = tmp_path.glob("gpu_check-*.json")
    record = json.loads(path.read_text())
    assert record["server"] == {"skipped": "time budget spent"}
    assert record["summary"]["server_greedy_identical"] is None and "| n/a |" in record["markdown"]
    # An error (which may name anything) breaks no table; a section that broke is a failure.
    record["decode"] = {"error": "KeyError: 'step_s'"}
    summary = gpu_check.summary(record)
    assert "engine, batch 1" not in gpu_check.markdown(record | {"summary": summary})

    def broken(*arguments):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_check, "check_correctness", broken)
    assert dry_run(["--allow-cpu", "--sections", "speed", "--results-dir", str(tmp_path)]) == 1


def test_every_model_the_check_quantizes_takes_tinygemm_at_its_int4_group(gpu_check):
    # The correctness model has SmolLM2's width, 576, which a group of 128 does not divide.
    from memwall.engine import Transformer
    from memwall.engine.cuda.int4 import layout_reason
    from memwall.engine.quant import Int4Linear, quantize
    from memwall.specs import get_spec

    for spec in (gpu_check.SMALL, *(get_spec(name) for name, _ in gpu_check.SPEED_MODELS)):
        model = Transformer.from_hf(gpu_check.random_hf(spec, torch.bfloat16, "meta"))
        int4 = quantize(model, "int4", group_size=gpu_check.int4_group(model), inplace=True)
        layers = [m for m in int4.modules() if isinstance(m, Int4Linear)]
        assert layers and all(layout_reason(layer) is None for layer in layers), spec.name


@pytest.mark.slow  # compiles four models of SmolLM2's widths: a minute or more from cold
def test_the_correctness_section_passes_at_the_shape_a_gpu_checks(gpu_check):
    # SmolLM2's widths (the dry run's tiny ones hid a group that did not divide them), compiled
    # here without graphs. In bf16 the readable and compiled steps break a near-tie apart within
    # a few steps of this prompt: compared on the same tokens they agree to rounding.
    out = gpu_check.check_correctness(gpu_check.SMALL, "cpu", "bf16", 6)
    assert out["ok"], out


def test_the_speed_model_leaves_room_for_the_copies_timed_at_once(gpu_check, monkeypatch):
    # transformers' copy and the engine's stay while the int8 copy is timed: on a 16 GB card
    # the 3B Llama (12.8 GB in two 16-bit copies) would run out of memory at int8.
    from types import SimpleNamespace

    for gigabytes, expected in ((80, "llama-3-8b"), (40, "llama-3.2-3b"), (16, "llama-3.2-1b")):
        props = SimpleNamespace(total_memory=gigabytes * 10**9)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, p=props: p)
        assert gpu_check.speed_model("cuda:0") == expected, gigabytes
