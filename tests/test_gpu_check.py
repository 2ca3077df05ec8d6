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


def test_the_dry_run_writes_every_key_and_checks_what_it_times(gpu_check, tmp_path):
    threads = torch.get_num_threads()
    try:
        status = gpu_check.main(
            ["--allow-cpu", "--sections", "speed,server", "--results-dir", str(tmp_path)]
        )
    finally:
        torch.set_num_threads(threads)  # the dry run takes one core
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
    from torch._inductor.cudagraph_utils import cudagraphs_log

    record, budget = {}, gpu_check.Budget(60, None)
    gpu_check.section(record, "server", budget, lambda: {"rows": []})
    assert "cudagraph_warnings" not in record["server"]
    skipped = "skipping cudagraphs due to mutated inputs (2 instances)"
    gpu_check.section(record, "server", budget, lambda: cudagraphs_log.warning(skipped) or {})
    assert record["server"]["cudagraph_warnings"] == [skipped]
    record["chapters"] = {"cudagraph_warnings_by_chapter": {"04_kv_cache.md": [
        f"W1207 cudagraph_utils.py:380] [__cudagraphs] {skipped}",
        "W1207 cudagraph_utils.py:510] [__cudagraphs] CUDAGraph supports dynamic shapes by ...",
    ]}}  # fmt: skip
    assert gpu_check.summary(record)["cudagraph_skips"] == 2  # the section's and a chapter's
