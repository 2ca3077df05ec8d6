"""Speculative decoding is exact: greedy tokens equal plain greedy decoding, sampled tokens follow
the target's distribution, and a broken acceptance rule is caught by the same statistical test."""

import pytest
import torch

from memwall import models
from memwall.engine import Sampling, Transformer, cast_copy, generate
from memwall.engine.drafts import (
    ModelDraft,
    PromptLookupDraft,
    SelfDraft,
    first_layers,
    lookup,
    parse_draft,
)
from memwall.engine.speculative import (
    exact_acceptance,
    expected_tokens_per_pass,
    speculative_generate,
)
from memwall.specs import ModelSpec


def random_engine(n_layers, d_model, seed, vocab=256, scale=8.0, max_context=128):
    """A small random Llama-shaped engine; `scale` sharpens its otherwise nearly flat logits."""
    spec = ModelSpec(
        name=f"rand{n_layers}x{d_model}",
        n_layers=n_layers,
        d_model=d_model,
        n_heads=2,
        n_kv_heads=1,
        head_dim=d_model // 2,
        d_ff=2 * d_model,
        vocab_size=vocab,
        tied_embeddings=True,
        max_context=max_context,
    )
    hf = models.random_init(spec, dtype=torch.float32, seed=seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return Transformer.from_hf(hf)


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny models run faster on one thread: spinning up and syncing a pool costs more than their
    arithmetic, and on a busy shared machine waiting for the pool dominates. The real model keeps
    the default."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    with _one_thread():
        yield


@pytest.fixture(scope="module")
def small_draft():
    """A separate draft model: fewer layers, narrower, same 256-token vocabulary as tiny_engine."""
    return random_engine(n_layers=1, d_model=32, seed=7)


PROMPT = [5, 17, 42, 5, 17, 99, 3, 5, 17]  # repeats, so the lookup draft finds n-grams


@pytest.mark.parametrize("k", [1, 3, 5])
def test_tiny_greedy_equals_plain_greedy_for_every_draft(tiny_engine, small_draft, k):
    plain = generate(tiny_engine, PROMPT, 40).tokens
    drafts = [
        SelfDraft(tiny_engine, 1),
        SelfDraft(tiny_engine, tiny_engine.n_layers),
        PromptLookupDraft(ngram=2),
        ModelDraft(small_draft),
    ]
    for draft in drafts:
        out = speculative_generate(tiny_engine, draft, PROMPT, 40, k=k)
        assert out.tokens == plain, type(draft).__name__
        assert sum(out.tokens_per_pass) == 40 and max(out.tokens_per_pass) <= k + 1


def test_full_depth_self_draft_is_always_accepted(tiny_engine):
    out = speculative_generate(
        tiny_engine, SelfDraft(tiny_engine, tiny_engine.n_layers), PROMPT, 21, k=4
    )
    assert out.acceptance_rate == 1.0 and out.tokens_per_pass == [5] * 4 + [1]


def test_greedy_stops_at_a_stop_token_like_generate(tiny_engine):
    plain = generate(tiny_engine, PROMPT, 30).tokens
    stop = plain[12]
    expected = generate(tiny_engine, PROMPT, 30, stop_tokens={stop}).tokens
    out = speculative_generate(
        tiny_engine, PromptLookupDraft(2), PROMPT, 30, k=4, stop_tokens={stop}
    )
    assert out.tokens == expected and out.tokens[-1] == stop


def test_separate_draft_model_of_another_size_is_exact_and_seeded(tiny_engine, small_draft):
    sampling = Sampling(temperature=0.9, seed=11)
    a = speculative_generate(
        tiny_engine, ModelDraft(small_draft), PROMPT, 25, k=3, sampling=sampling
    )
    b = speculative_generate(
        tiny_engine, ModelDraft(small_draft), PROMPT, 25, k=3, sampling=sampling
    )
    assert a.tokens == b.tokens and len(a.tokens) == 25
    assert 0 <= a.accepted <= a.proposed and a.target_passes == len(a.tokens_per_pass)


def test_a_verify_pass_differs_from_single_steps_by_rounding_only():
    """Why greedy speculative output is exact in fp32 and may differ in bf16: a verify pass over
    k+1 tokens sums the same products in another order than k+1 single steps. In fp32 that moves
    the logits by about 1e-7 of their size, so greedy tokens agree (unless two logits tie to
    that precision); in bf16 by about one bf16 step, so where the top two logits are that close
    the argmax can flip, and only there."""
    k = 4
    for dtype in (torch.float32, torch.bfloat16):
        model = random_engine(2, 64, seed=21, scale=1.0, max_context=256)  # realistic near-ties
        model = cast_copy(model, dtype)
        sequence = torch.randint(0, 256, (1, 8 + 30 * (k + 1)), generator=_seeded(3))
        singles, passes = (
            model.new_cache(1, sequence.shape[1]),
            model.new_cache(1, sequence.shape[1]),
        )
        with torch.inference_mode():
            model(sequence[:, :8], singles), model(sequence[:, :8], passes)
            one = torch.cat(
                [model(sequence[:, [t]], singles)[0] for t in range(8, sequence.shape[1])]
            )
            chunked = torch.cat(
                [
                    model(sequence[:, t : t + k + 1], passes)[0]
                    for t in range(8, sequence.shape[1], k + 1)
                ]
            )
        one, chunked = one.float(), chunked.float()
        scale = one.abs().max()
        step = 2.0**-7 * scale if dtype == torch.bfloat16 else 2.0**-20 * scale  # one rounding step
        assert (one - chunked).abs().max() <= 2 * step
        top2 = one.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        flipped = one.argmax(-1) != chunked.argmax(-1)
        assert (margin[flipped] <= 2 * step).all()  # flips happen at near-ties only
        if dtype == torch.bfloat16:
            assert (one - chunked).abs().max() > 0  # the orders differ, and bf16 shows it
        else:
            assert not flipped.any()
            plain = generate(model, PROMPT, 60).tokens
            for draft in (SelfDraft(model, 1), PromptLookupDraft(ngram=2)):
                assert speculative_generate(model, draft, PROMPT, 60, k=k).tokens == plain


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.slow
def test_smollm2_greedy_speculative_equals_plain_greedy(smollm2, smollm2_engine):
    _, tokenizer = smollm2
    prompt = tokenizer("Once upon a time, in a small village by the sea,").input_ids
    plain = generate(smollm2_engine, prompt, 48).tokens
    for draft in (SelfDraft(smollm2_engine, 8), PromptLookupDraft(ngram=3)):
        assert speculative_generate(smollm2_engine, draft, prompt, 48, k=3).tokens == plain


# ---- the output distribution is the target's ------------------------------------------------

VOCAB = 12
SAMPLINGS = {
    "T=1": Sampling(temperature=1.0),
    "T=0.7,top_p=0.9": Sampling(temperature=0.7, top_p=0.9),
}


@pytest.fixture(scope="module")
def toy_pair():
    """A 2-layer target and a different, sharper 1-layer draft over a 12-token vocabulary, picked
    so that the residual max(0, p - q) differs clearly from p (a weak test would miss that bug)."""
    with _one_thread():
        return random_engine(2, 32, seed=0, vocab=VOCAB, scale=3.0), random_engine(
            1, 16, seed=5, vocab=VOCAB, scale=16.0
        )


def exact_two_token_distribution(target, first_token, sampling):
    """P(x1, x2) = p(x1 | prompt) p(x2 | prompt, x1), read off the target's probabilities."""
    from memwall.engine import probabilities

    with torch.inference_mode():
        both = torch.tensor([[first_token, x1] for x1 in range(VOCAB)])
        logits = target(both)  # [VOCAB, 2, VOCAB]
        p1 = probabilities(logits[0, 0], sampling)
        p2 = probabilities(logits[:, 1], sampling)
    return p1[:, None] * p2


def sampled_two_token_counts(
    target, draft, first_token, sampling, samples, acceptance=exact_acceptance
):
    counts = torch.zeros(VOCAB, VOCAB)
    for seed in range(samples):
        seeded = Sampling(sampling.temperature, sampling.top_p, seed=seed)
        # k=1, 2 tokens: an accepted guess then a bonus token, or a rejection, the residual, a
        # rollback and one more target pass: every branch of the algorithm.
        x1, x2 = speculative_generate(
            target, ModelDraft(draft), [first_token], 2, k=1, sampling=seeded, acceptance=acceptance
        ).tokens
        counts[x1, x2] += 1
    return counts


def chi_square_p_value(counts, probs, min_expected=5.0):
    """Pearson's chi-square goodness of fit; cells expected fewer than 5 times are pooled."""
    assert counts[probs == 0].sum() == 0, "a token the target can never produce was emitted"
    n = counts.sum()
    expected, observed = (probs * n).flatten(), counts.flatten()
    small = expected < min_expected
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    observed = torch.cat([observed[~small], observed[small].sum()[None]])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic.double() / 2)
    )


def p_values(counts, exact):
    """Goodness of fit of the first token alone (the most sensitive) and of the pair (x1, x2)."""
    return chi_square_p_value(counts.sum(1), exact.sum(1)), chi_square_p_value(counts, exact)


FIRST = 0  # the one-token prompt


@pytest.mark.once  # the sampling rule's statistics, the same on every kernel path
@pytest.mark.parametrize("name", SAMPLINGS)
def test_sampled_tokens_follow_the_target_distribution(toy_pair, name):
    target, draft = toy_pair
    exact = exact_two_token_distribution(target, FIRST, SAMPLINGS[name])
    counts = sampled_two_token_counts(target, draft, FIRST, SAMPLINGS[name], samples=1200)
    assert min(p_values(counts, exact)) > 1e-3


def always_accept(p, q, guesses, generator=None):
    k = len(guesses)
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def resample_from_target(p, q, guesses, generator=None):
    """Right acceptance test, wrong replacement: draws from p instead of the residual max(0, p - q)."""
    k = len(guesses)
    rows = torch.arange(k)
    accepted = torch.rand(k, generator=generator) * q[rows, guesses] < p[rows, guesses]
    n = int(accepted.long().cumprod(0).sum())
    return n, int(torch.multinomial(p[n], 1, generator=generator))


@pytest.mark.once
@pytest.mark.parametrize(
    "broken_rule", [always_accept, resample_from_target], ids=lambda f: f.__name__
)
def test_the_statistical_test_catches_a_broken_acceptance_rule(toy_pair, broken_rule):
    target, draft = toy_pair
    sampling = SAMPLINGS["T=1"]
    exact = exact_two_token_distribution(target, FIRST, sampling)
    counts = sampled_two_token_counts(
        target, draft, FIRST, sampling, samples=400, acceptance=broken_rule
    )
    assert min(p_values(counts, exact)) < 1e-6


@pytest.mark.once
def test_exact_rule_on_a_toy_distribution_reproduces_p():
    p = torch.tensor(
        [[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]]
    )  # row 1 is only used for a bonus token
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        guess = torch.multinomial(q[0], 1, generator=generator)
        n, token = exact_acceptance(p, q, guess, generator)
        counts[guess if n == 1 else token] += 1
    assert chi_square_p_value(counts, p[0]) > 1e-3


# ---- pieces -------------------------------------------------------------------------------


def test_expected_tokens_per_pass_formula():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_pass(0.8, 4) == pytest.approx(sum(0.8**i for i in range(5)))


def test_lookup_finds_latest_earlier_ngram():
    context = [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert lookup(context, 3, 2) == [7, 8]
    assert lookup(context, 3, 5) == [7, 8, 1, 2, 3]
    assert lookup([1, 2, 3], 2, 4) == []
    draft = PromptLookupDraft(ngram=3)
    assert draft.propose([4, 5, 6, 4, 5], 3, Sampling()).tokens == [6, 4, 5]
    assert draft.propose([1, 2, 3], 3, Sampling()).tokens == []


def test_self_draft_shares_weights_and_runs_fewer_layers(tiny_engine):
    view = first_layers(tiny_engine, 2)
    assert view.n_layers == 2 and len(view.blocks) == 2 and tiny_engine.n_layers == 3
    assert view.blocks[0] is tiny_engine.blocks[0] and view.lm_head is tiny_engine.lm_head
    assert len(tiny_engine.blocks) == 3 and view.new_cache(max_tokens=4).keys.shape[0] == 2


def test_bad_input_is_rejected_clearly(tiny_engine):
    with pytest.raises(ValueError, match="n_layers"):
        SelfDraft(tiny_engine, 0)
    with pytest.raises(ValueError, match="ngram"):
        PromptLookupDraft(0)
    with pytest.raises(ValueError, match="k "):
        speculative_generate(tiny_engine, PromptLookupDraft(), [1, 2], 4, k=0)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(tiny_engine, ModelDraft(random_engine(1, 16, 0, vocab=100)), [1, 2], 4)
    with pytest.raises(ValueError, match="valid forms"):
        parse_draft("medusa:3", tiny_engine)
    with pytest.raises(ValueError, match="bad draft"):
        parse_draft("self:x", tiny_engine)


class _one_thread:
    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


def test_bench_speculative_reports_alpha_and_the_formula(tiny_engine):
    from memwall.bench.speculative import bench_speculative

    result = bench_speculative(
        tiny_engine, "self:3", k=2, new_tokens=9, repeats=1, warmup=0, progress=False
    )
    assert result["acceptance_rate"] == 1.0 and result["identical_to_plain"]
    assert result["mean_tokens_per_pass"] == result["formula_tokens_per_pass"] == 3.0
    assert result["tokens_per_pass"] == [3, 3, 3] and result["speedup"] > 0
