"""Shared fixtures. The real SmolLM2-135M is loaded once per session (from memwall's cache)."""

import os

import pytest
import torch

# The CPU twins take kernel paths by the fixed rule, not by timing this machine: tests must not
# depend on timings. Tests that compare paths pin them (memwall.engine.cpu.path_choice).
os.environ.setdefault("MEMWALL_KERNEL_PATH", "fixed")
# The tests (and the books they build) check the CPU paths, also on a machine with a GPU, where
# the chapters would otherwise run on it; the GPU has its own check, benchmarks/gpu_check.sh.
os.environ.setdefault("MEMWALL_DEVICE", "cpu")


@pytest.fixture(scope="session")
def smollm2():
    """(transformers model, tokenizer) for the offline SmolLM2-135M-Instruct, in fp32."""
    from memwall import models

    return models.load("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_engine(smollm2):
    from memwall.engine import Transformer

    return Transformer.from_hf(smollm2[0])


@pytest.fixture(scope="session")
def tiny_hf():
    """A small random-init Llama-shaped transformers model: no model file needed."""
    from memwall import models
    from memwall.specs import ModelSpec

    spec = ModelSpec(
        name="tiny",
        n_layers=3,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=160,
        vocab_size=256,
        tied_embeddings=True,
        max_context=256,
    )
    model = models.random_init(spec, dtype=torch.float32, seed=0)
    # Default init gives nearly flat logits, where greedy ties flip on rounding; sharpen them.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return model


@pytest.fixture(scope="session")
def tiny_engine(tiny_hf):
    from memwall.engine import Transformer

    return Transformer.from_hf(tiny_hf)
