"""Perplexity and top-1 agreement: exact on models whose answers we know, windowing scores every
token once, and the engine and transformers agree."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from memwall import quality

VOCAB = 11


class Bigram(torch.nn.Module):
    """Logits depend on the current token only, so windowing cannot change any score."""

    def __init__(self, seed=0):
        super().__init__()
        self.table = torch.nn.Parameter(
            torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed))
        )

    def forward(self, tokens):
        return self.table[tokens]


class Uniform(torch.nn.Module):
    def forward(self, tokens):
        return torch.zeros(*tokens.shape, VOCAB)


def random_ids(n, vocab=VOCAB, seed=1):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_uniform_model_has_perplexity_equal_to_the_vocabulary():
    assert quality.perplexity(Uniform(), random_ids(50)) == pytest.approx(VOCAB, rel=1e-6)


def test_bigram_perplexity_matches_a_direct_computation():
    model, ids = Bigram(), random_ids(40)
    log_probs = torch.log_softmax(model.table.detach().double(), -1)
    expected = math.exp(-sum(log_probs[a, b].item() for a, b in zip(ids, ids[1:])) / (len(ids) - 1))
    assert quality.perplexity(model, ids) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("window, stride", [(2, None), (3, None), (7, 3), (7, 7), (1, 1), (64, 5)])
def test_windows_score_every_token_exactly_once(window, stride):
    model, ids = Bigram(), random_ids(37)
    whole = quality.score(model, ids, window=1000)
    chunked = quality.score(model, ids, window=window, stride=stride)
    assert len(chunked.nll) == len(ids) - 1
    assert torch.equal(chunked.targets, torch.tensor(ids[1:]))
    assert torch.allclose(chunked.nll, whole.nll)
    assert torch.equal(chunked.predictions, whole.predictions)


def test_engine_score_matches_cross_entropy_of_full_logits(tiny_engine):
    ids = random_ids(60, vocab=256, seed=3)
    with torch.inference_mode():
        logits = tiny_engine(torch.tensor([ids]))[0]
    expected = math.exp(F.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:])).item())
    result = quality.score(tiny_engine, ids, window=100)
    assert result.perplexity == pytest.approx(expected, rel=1e-6)
    assert torch.equal(result.predictions, logits[:-1].argmax(-1))


def test_short_windows_lose_context_on_a_real_sequence_model(tiny_engine):
    ids = random_ids(60, vocab=256, seed=3)
    full = quality.score(tiny_engine, ids, window=60)
    chunked = quality.score(tiny_engine, ids, window=20)
    # the first window is the same; later windows start without context, so their scores differ
    assert torch.allclose(full.nll[:19], chunked.nll[:19])
    assert not torch.allclose(full.nll[19:], chunked.nll[19:])


def test_engine_and_transformers_agree(tiny_hf, tiny_engine):
    ids = random_ids(40, vocab=256, seed=4)
    assert quality.perplexity(tiny_engine, ids, window=16) == pytest.approx(
        quality.perplexity(tiny_hf, ids, window=16), rel=1e-5
    )
    assert quality.top1_agreement(tiny_engine, tiny_hf, ids, window=16) == 1.0


def test_top1_agreement_counts_matching_predictions():
    ids = random_ids(30)
    a, b = quality.score(Bigram(0), ids), quality.score(Bigram(1), ids)
    expected = (a.predictions == b.predictions).double().mean().item()
    assert 0 < expected < 1
    assert quality.top1_agreement(a, b) == pytest.approx(expected)
    assert quality.top1_agreement(Bigram(0), b, ids) == pytest.approx(expected)
    assert quality.top1_agreement(a, a) == 1.0
    assert a.accuracy == pytest.approx(
        (a.predictions == torch.tensor(ids[1:])).double().mean().item()
    )


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        quality.perplexity(Bigram(), [3])
    with pytest.raises(ValueError, match="window"):
        quality.perplexity(Bigram(), random_ids(5), window=0)
    with pytest.raises(ValueError, match="stride"):
        quality.perplexity(Bigram(), random_ids(5), window=2, stride=3)
    with pytest.raises(ValueError, match="token_ids"):
        quality.perplexity(Bigram())
    with pytest.raises(ValueError, match="different texts"):
        quality.top1_agreement(
            quality.score(Bigram(), random_ids(9)), quality.score(Bigram(), random_ids(9, seed=2))
        )


def test_the_shipped_text_is_long_varied_prose_declared_as_package_data():
    text = quality.eval_text()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    assert len(paragraphs) >= 10 and 1200 <= len(text.split()) <= 2500
    assert text.isascii()
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '[tool.setuptools.package-data]\n"memwall.data" = ["*.txt"]' in pyproject


@pytest.mark.slow
def test_the_shipped_text_is_about_two_thousand_smollm2_tokens(smollm2):
    ids = quality.eval_token_ids(smollm2[1])
    assert 1500 <= len(ids) <= 3000
    assert quality.eval_token_ids(smollm2[1], max_tokens=100) == ids[:100]
