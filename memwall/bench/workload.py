"""What a benchmark runs on: a model (real, or random weights in a real shape) and a prompt.

`--model smollm2-135m` loads real weights through `memwall.models.load`; `--model random:llama-3-8b`
builds the catalog spec with random weights (`memwall.models.random_init`), because for speed
only the bytes matter and an 8B checkpoint is not needed to time one.
"""

from __future__ import annotations

import torch

from memwall.bench.harness import DTYPES

RANDOM_PREFIX = "random:"

# A fixed, ordinary paragraph, so prompts from real tokenizers are real text (repeated to length).
PROMPT_TEXT = (
    "The history of computing is a history of moving data. Processors became fast long "
    "before memory did, and every generation of hardware since has added caches, wider "
    "buses and new kinds of memory to keep the arithmetic units fed. "
)


def load_model(name: str, dtype: str, device: str, seed: int = 0):
    """(transformers model on `device` in `dtype`, tokenizer or None) for a model name or "random:<spec>"."""
    from memwall import models

    torch_dtype = DTYPES[dtype]
    if name.startswith(RANDOM_PREFIX):
        from memwall.specs import get_spec

        spec = get_spec(name[len(RANDOM_PREFIX) :])  # ValueError naming the catalog if unknown
        return models.random_init(spec, dtype=torch_dtype, device=device, seed=seed), None
    hf_model, tokenizer = models.load(name)  # fp32 on CPU; cast and move after
    return hf_model.to(device=device, dtype=torch_dtype).eval(), tokenizer


def make_prompt(n_tokens: int, vocab_size: int, tokenizer=None, seed: int = 0) -> list[int]:
    """`n_tokens` prompt ids: real text through `tokenizer` if given, else seeded random ids."""
    if tokenizer is not None:
        ids = tokenizer(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
        return (ids * (n_tokens // len(ids) + 1))[:n_tokens]
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n_tokens,), generator=generator).tolist()


def hf_weight_bytes_per_step(hf_model) -> int:
    """Weight bytes a transformers model reads per decode step: every parameter once, except an
    untied input embedding table, of which a step reads one row (the lookup)."""
    embedding = hf_model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in hf_model.parameters())  # shared tensors once
    if not hf_model.config.tie_word_embeddings:
        total -= embedding.numel() * embedding.element_size()
    return total + embedding.shape[1] * embedding.element_size()


def kv_bytes_per_token(config, element_size: int) -> int:
    """2 (keys and values) x layers x KV heads x head dim x bytes, from a transformers config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element_size
