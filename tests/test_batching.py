"""Batched decode: every sequence in a batch gets exactly the tokens it would get alone."""

import pytest
import torch

from memwall.engine import generate
from memwall.engine.batch import (
    decode_positions_and_mask,
    generate_batch,
    left_pad,
    prefill_positions_and_mask,
)


def random_prompts(lengths, seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def test_left_pad_right_aligns_prompts():
    tokens, pads = left_pad([[5, 6, 7], [8]], pad=0)
    assert tokens.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert pads.tolist() == [0, 2]


def test_positions_skip_the_padding_and_pad_slots_are_never_attended():
    pads = torch.tensor([0, 2])
    positions, mask = prefill_positions_and_mask(pads, 3)
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]]  # pad slots clamp to position 0
    # Row 1's real token sits in slot 2 at position 0 and attends only to itself.
    assert mask[1, 0, 2].tolist() == [False, False, True]
    assert mask[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert mask.any(-1).all()  # no empty softmax row, or NaNs would leak into the cache
    positions, mask = decode_positions_and_mask(pads, 3)
    assert positions.tolist() == [[3], [1]]
    assert mask[:, 0, 0].tolist() == [[True] * 4, [False, False, True, True]]


def test_tiny_batch_matches_solo_decoding(tiny_engine):
    prompts = random_prompts([3, 11, 7, 1, 16])
    out = generate_batch(tiny_engine, prompts, 24)
    for prompt, tokens in zip(prompts, out.tokens):
        assert tokens == generate(tiny_engine, prompt, 24).tokens
    assert len(out.step_times_s) == 23


def test_tiny_equal_lengths_take_the_unmasked_path(tiny_engine):
    prompts = random_prompts([6, 6, 6], seed=1)
    out = generate_batch(tiny_engine, prompts, 12)
    assert out.tokens == [generate(tiny_engine, p, 12).tokens for p in prompts]


def test_stop_tokens_end_each_sequence_separately(tiny_engine):
    prompts = random_prompts([4, 9], seed=2)
    solo = [generate(tiny_engine, p, 20).tokens for p in prompts]
    stop = solo[0][
        5
    ]  # the first sequence stops at its 6th token; the other runs on unless it emits it
    out = generate_batch(tiny_engine, prompts, 20, stop_tokens=(stop,))
    for tokens, reference in zip(out.tokens, solo):
        cut = reference.index(stop) + 1 if stop in reference else len(reference)
        assert tokens == reference[:cut]


@pytest.mark.parametrize(
    "prompts, new, message",
    [
        ([], 4, "at least one prompt"),
        ([[1], []], 4, "at least one token"),
        ([[1]], 0, "max_new_tokens"),
        ([[1] * 250], 10, "exceeds"),
    ],
)
def test_bad_input_is_rejected(tiny_engine, prompts, new, message):
    with pytest.raises(ValueError, match=message):
        generate_batch(tiny_engine, prompts, new)


@pytest.mark.slow
def test_smollm2_batch_matches_solo_decoding(smollm2, smollm2_engine):
    _, tokenizer = smollm2
    texts = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "def fibonacci(n):",
        "Memory bandwidth limits the speed of large language model inference because every token",
    ]
    prompts = [tokenizer(t).input_ids for t in texts]
    assert len({len(p) for p in prompts}) == len(prompts)  # really different lengths
    out = generate_batch(smollm2_engine, prompts, 16)
    for prompt, tokens in zip(prompts, out.tokens):
        assert tokens == generate(smollm2_engine, prompt, 16).tokens


@pytest.mark.parametrize("fast", [False, True], ids=["readable", "fast"])
def test_bench_batch_reports_every_batch_size_with_a_prediction(tiny_hf, fast):
    from memwall.bench.batch import bench_batch
    from memwall.hardware import get_hardware

    result = bench_batch(
        tiny_hf,
        [1, 3],
        context=5,
        new_tokens=3,
        repeats=1,
        warmup=0,
        hardware=get_hardware("laptop-100gbs"),
        fast=fast,
    )
    assert result["engine"] == ("memwall-fast" if fast else "memwall")
    assert [row["batch"] for row in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["tok_per_s"] > 0 and row["predicted_tok_per_s"] > 0
        assert row["kv_bytes"] == row["batch"] * (5 + 2) * (
            2 * 3 * 2 * 16 * 4
        )  # mean context 5 + (3 + 1) / 2
        assert row["bytes_per_step"] == row["weight_bytes"] + row["kv_bytes"]
    assert result["rows"][0]["speedup_over_first"] == 1


@pytest.mark.parametrize("text", ["", "0,2", "a,b", "-1"])
def test_bench_batch_rejects_bad_batch_lists(text):
    from memwall.bench.batch import parse_batches

    with pytest.raises(ValueError, match="comma-separated list of positive integers"):
        parse_batches(text)
    assert parse_batches("1, 2,16") == [1, 2, 16]
