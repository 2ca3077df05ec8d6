"""Memory a chapter needs: one copy of the weights, a bandwidth test sized to the machine, and
the helpers that report RSS (the book's memory test uses `notebook_peak_rss`)."""

import copy
import json

import pytest
import torch

from memwall import memory, models
from memwall.engine import Transformer, share_weights, shared_engine
from memwall.hardware import MiB, working_set_bytes
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


def test_measure_working_set_is_far_above_the_cache_and_fits_in_memory():
    assert working_set_bytes(False, 32 * MiB, 20 * 2**30) == 256 * MiB
    assert working_set_bytes(True, 32 * MiB, 20 * 2**30) == 128 * MiB
    assert working_set_bytes(False, 96 * MiB, 64 * 2**30) == 768 * MiB  # 8x a larger L3
    # Binder: 1.2 GB free -> two buffers in a quarter of it, still several times a 32 MiB L3.
    assert working_set_bytes(False, 32 * MiB, 1_200_000_000) == 143 * MiB
    assert working_set_bytes(False, 0, 0) == 256 * MiB  # unknown cache and memory


def test_rss_and_available_memory(tmp_path, monkeypatch):
    current = memory.current_rss_bytes()
    assert current > 10 * MiB and memory.peak_rss_bytes() > 0.9 * current  # the peak lags a little
    assert memory.available_memory_bytes() > 0
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("2000000000\n")
    usage.write_text("1500000000\n")
    monkeypatch.setattr(memory, "_CGROUP_FILES", ((str(limit), str(usage)),))
    assert memory.available_memory_bytes() == 500_000_000  # the container's limit, not the host's
    limit.write_text("max\n")
    assert memory.available_memory_bytes() > 500_000_000


@pytest.mark.slow
def test_notebook_peak_rss_sees_what_the_kernel_allocated(tmp_path):
    pytest.importorskip("nbclient")
    import nbformat

    def notebook(name, code):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        path = tmp_path / name
        nbformat.write(nb, path)
        return path

    small = memory.notebook_peak_rss(notebook("small.ipynb", "x = 1"), timeout=120)
    big = memory.notebook_peak_rss(
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
    failing = memory.notebook_peak_rss(myst, timeout=120)  # its cell ran, and raised
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
