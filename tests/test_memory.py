"""Memory a chapter needs: one copy of the weights, the container's limit read from its cgroup
files, a bandwidth test sized within the memory budget, and the helpers that report RSS."""

import copy
import json
import subprocess
import sys

import pytest
import torch

from memwall import models
from memwall.engine import Transformer, share_weights, shared_engine
from memwall.machine import memory, notebook_peak
from memwall.machine.memory import MiB
from memwall.specs import ModelSpec


def tiny_model(tied=True):
    spec = ModelSpec(
        name="tiny-shared",
        n_layers=2,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=48,
        vocab_size=64,
        tied_embeddings=tied,
        max_context=64,
    )
    return models.random_init(spec, dtype=torch.float32, seed=1)


def storages(module):
    return {t.untyped_storage().data_ptr() for t in module.parameters()}


@pytest.mark.parametrize("tied", [True, False])
def test_shared_weights_are_one_copy_and_change_no_logit(tied):
    hf = tiny_model(tied=tied)
    engine = Transformer.from_hf(hf)
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        hf_before, engine_before = hf(tokens).logits, engine(tokens)
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    freed = share_weights(engine, hf)
    assert freed == weight_bytes  # every transformers weight now lives in the engine
    assert storages(hf) <= storages(engine)
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, hf_before)
        assert torch.equal(engine(tokens), engine_before)
    assert share_weights(engine, hf) == 0  # a second call finds nothing left to share


def test_a_tied_head_stays_one_parameter_after_sharing():
    from memwall.bench.workload import hf_weight_bytes_per_step

    hf = tiny_model(tied=True)
    before = hf_weight_bytes_per_step(hf)
    share_weights(Transformer.from_hf(hf), hf)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight
    assert hf_weight_bytes_per_step(hf) == before  # the table is read once, not twice


def test_a_tied_head_shares_the_embedding_inside_the_engine():
    engine = Transformer.from_hf(tiny_model(tied=True))
    assert engine.lm_head.weight is engine.embed.weight
    untied = Transformer.from_hf(tiny_model(tied=False))
    assert untied.lm_head.weight.data_ptr() != untied.embed.weight.data_ptr()


def test_a_quantized_layer_keeps_its_transformers_twin():
    from memwall.engine.quant import quantize

    hf = tiny_model()
    engine = quantize(Transformer.from_hf(hf), "int8", head="float")
    tokens = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        before = hf(tokens).logits
    share_weights(engine, hf)  # only the norms and embeddings are still float in the engine
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, before)
    assert hf.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32


@pytest.mark.parametrize("tied", [True, False])
def test_shared_engine_reads_the_checkpoint_into_the_engine(tmp_path, monkeypatch, tied):
    from transformers import AutoModelForCausalLM

    tiny_model(tied=tied).save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    reference = Transformer.from_hf(AutoModelForCausalLM.from_pretrained(tmp_path))
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        expected = hf(tokens).logits
    monkeypatch.setattr(Transformer, "from_hf", None)  # the direct path must not need it
    engine = shared_engine(hf)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(engine.state_dict()[name], tensor), name
    assert storages(hf) <= storages(engine)
    assert (engine.lm_head.weight is engine.embed.weight) == tied
    with torch.no_grad():
        assert torch.equal(hf(tokens).logits, expected)


def test_shared_engine_copies_when_the_file_does_not_match(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_model().save_pretrained(tmp_path)  # fp32 on disk, bf16 in memory: no direct read
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    engine = shared_engine(hf)
    assert engine.embed.weight.dtype == torch.bfloat16 and storages(hf) <= storages(engine)


GiB = 2**30
MEMINFO = "MemTotal:       25000000 kB\nMemFree:  1000 kB\nMemAvailable:   20000000 kB\n"


def fake_root(tmp_path, cgroup_lines: str, files: dict[str, str], meminfo: str = MEMINFO):
    """A file tree with /proc/self/cgroup, /proc/meminfo and the given cgroup files."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup_lines)
    (tmp_path / "proc/meminfo").write_text(meminfo)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_cgroup_v2_limit_is_the_tightest_along_a_nested_path(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/user.slice/binder/session-1\n",
        {
            "cgroup.controllers": "cpu memory\n",
            "user.slice/memory.max": "max\n",
            "user.slice/binder/memory.max": "2000000000\n",  # the parent's limit binds
            "user.slice/binder/memory.current": "1500000000\n",
            "user.slice/binder/memory.stat": "anon 1000\ninactive_file 100000000\n",
            "user.slice/binder/session-1/memory.max": "max\n",
            "user.slice/binder/session-1/memory.current": "1200000000\n",
        },
    )
    limit = memory.memory_limit(root)
    assert (limit.source, limit.limit_bytes) == ("cgroup v2", 2_000_000_000)
    assert limit.used_bytes == 1_400_000_000  # usage less the page cache it can drop
    assert limit.available_bytes == 600_000_000  # not the host's 20 GB
    assert limit.total_bytes == 2_000_000_000
    assert memory.available_memory_bytes(root) == 600_000_000


def test_cgroup_v2_max_everywhere_means_the_host(tmp_path):
    root = fake_root(
        tmp_path,
        "0::/docker/abc\n",  # a host-side path the container cannot see: its mount is its group
        {"cgroup.controllers": "memory\n", "memory.max": "max\n", "memory.current": "5\n"},
    )
    limit = memory.memory_limit(root)
    assert (limit.source, limit.limit_bytes) == ("host", None)
    assert limit.available_bytes == 20_000_000 * 1024 and limit.total_bytes == 25_000_000 * 1024


def test_cgroup_v1_limit_and_its_no_limit_number(tmp_path):
    lines = "4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n"
    files = {  # a hybrid host: v1 controllers and an empty v2 tree at unified/
        "unified/cgroup.controllers": "\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/process_api/abc/memory.limit_in_bytes": "1073741824\n",
        "memory/process_api/abc/memory.usage_in_bytes": "73741824\n",
    }
    limit = memory.memory_limit(fake_root(tmp_path, lines, files))
    assert (limit.source, limit.limit_bytes, limit.available_bytes) == (
        "cgroup v1",
        GiB,
        GiB - 73741824,
    )
    unlimited = fake_root(
        tmp_path / "none", lines, {"memory/memory.limit_in_bytes": "9223372036854771712\n"}
    )
    assert memory.memory_limit(unlimited).limit_bytes is None


def test_no_cgroup_files_at_all_is_the_host(tmp_path):
    limit = memory.memory_limit(fake_root(tmp_path, "", {}))
    assert limit.source == "host" and limit.available_bytes == 20_000_000 * 1024


def test_the_buffer_budget_is_an_eighth_of_what_is_available_and_capped():
    assert memory.buffer_budget_bytes(1 * GiB) == 128 * MiB  # a Binder session
    assert memory.buffer_budget_bytes(64 * GiB) == memory.BUDGET_CAP  # a big host
    assert memory.buffer_budget_bytes(0) == memory.BUDGET_CAP  # unknown memory
    assert memory.buffer_budget_bytes() <= memory.BUDGET_CAP
    with pytest.raises(ValueError, match="at least 0"):
        memory.buffer_budget_bytes(-1)


def test_a_child_of_a_big_process_reports_its_own_peak():
    """getrusage's peak carries over from the parent on Linux; peak_rss_bytes must not."""
    ballast = bytearray(600 * MiB)
    ballast[::4096] = b"x" * len(ballast[::4096])  # resident in this (the parent) process
    script = "from memwall.machine.memory import peak_rss_bytes; print(peak_rss_bytes())"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    del ballast
    assert int(done.stdout) < 500 * MiB


def test_rss_and_available_memory():
    current = memory.current_rss_bytes()
    assert current > 10 * MiB and memory.peak_rss_bytes() > 0.9 * current  # the peak lags a little
    assert memory.available_memory_bytes() > 0


PROBE_PEAK = """
from memwall.machine.memory import peak_rss_bytes
from memwall.machine.probe import RooflineProbe
probe = RooflineProbe("cpu", reads=1)
probe()  # every page of its buffer touched, so resident
print(peak_rss_bytes(), probe.working_set_bytes)
"""


def test_a_probe_holds_its_buffer_only_while_it_measures():
    pytest.importorskip("torch")
    from memwall.machine.probe import RooflineProbe

    probe = RooflineProbe("cpu", working_set_bytes=64 * MiB, reads=1)
    before = memory.current_rss_bytes()
    assert probe() > 0
    assert memory.current_rss_bytes() - before < 16 * MiB  # the 64 MiB went back after the call


@pytest.mark.parametrize("cache_mib", [0, 32, 480])
def test_a_roofline_probe_fits_a_binder_session_whatever_the_cache(tmp_path, cache_mib):
    """A huge last-level cache once made the probe's buffer 4x it (2.2 GB): the budget caps it."""
    script = tmp_path / "probe_peak.py"
    # The cache size is faked before the probe is built; the rest is the real machine room.
    script.write_text(
        "from memwall.machine import caches, working_set\n"
        f"working_set.last_level_cache_bytes = lambda: {cache_mib} * 2**20\n" + PROBE_PEAK
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True
    )
    peak, buffer = map(int, done.stdout.split())
    assert buffer <= memory.BUDGET_CAP
    assert peak < 1.2e9, f"peak RSS {peak / 1e9:.2f} GB with a {cache_mib} MiB cache"


@pytest.mark.slow
def test_notebook_peak_rss_sees_what_the_kernel_allocated(tmp_path):
    pytest.importorskip("nbclient")
    import nbformat

    def notebook(name, code):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        path = tmp_path / name
        nbformat.write(nb, path)
        return path

    small = notebook_peak.notebook_peak_rss(notebook("small.ipynb", "x = 1"), timeout=120)
    big = notebook_peak.notebook_peak_rss(
        notebook(
            "big.ipynb", "block = bytearray(400 * 2**20)\nblock[::4096] = b'x' * len(block[::4096])"
        ),
        timeout=120,
    )
    assert small["ok"] and big["ok"], (small, big)
    assert big["peak_rss_bytes"] - small["peak_rss_bytes"] > 350 * MiB
    myst = tmp_path / "chapter.md"  # the chapters' source format
    myst.write_text(
        "---\njupytext:\n  text_representation:\n    format_name: myst\n"
        "kernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n"
        "```{code-cell} ipython3\nx = 1 / 0\n```\n"
    )
    failing = notebook_peak.notebook_peak_rss(myst, timeout=120)  # its cell ran, and raised
    assert not failing["ok"] and "ZeroDivisionError" in failing["error"]
    assert json.dumps(failing)  # plain values, for a report


def test_a_cast_copy_converts_each_tensor_and_keeps_ties(tiny_engine):
    from memwall.engine import cast_copy

    half = cast_copy(tiny_engine, torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in tiny_engine.parameters()} == {torch.float32}  # the original stays
    reference = copy.deepcopy(tiny_engine).to(torch.bfloat16)
    for (name, mine), (_, theirs) in zip(half.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(mine, theirs), name
    if tiny_engine.lm_head.weight is tiny_engine.embed.weight:
        assert half.lm_head.weight is half.embed.weight
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.allclose(half(tokens).float(), reference(tokens).float())
