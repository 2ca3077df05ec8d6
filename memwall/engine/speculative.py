"""Speculative decoding: a cheap draft guesses k tokens, the target checks them all in one pass.

Decode at batch 1 is memory-bound: each step reads every weight to produce one token. Feeding the
target k+1 tokens (the last accepted token plus k guesses) reads the weights once and gives k+1
next-token distributions, so every guess the target agrees with is a token for free.

The acceptance rule makes the output distribution exactly the target's (Leviathan et al. 2023,
"Fast inference from transformers via speculative decoding"; Chen et al. 2023, "Accelerating large
language model decoding with speculative sampling"). For a guess x drawn from the draft's q, with
p the target's distribution at that position:

- accept x with probability min(1, p(x) / q(x));
- on the first rejection, draw the token instead from the residual normalize(max(0, p - q)) and
  stop: the later guesses were conditioned on a token that is now gone;
- if every guess is accepted, draw one bonus token from the target's last distribution.

Why it is exact: P(emit x) = q(x) min(1, p/q) + P(reject) residual(x) = min(p, q)(x) +
(1 - sum min(p, q)) * max(0, p - q)(x) / sum max(0, p - q), and since sum max(0, p - q) =
1 - sum min(p, q), that is min(p, q) + max(0, p - q) = p(x). Greedy decoding is the same rule with
point masses: a guess survives iff it equals the target's argmax, and the replacement is the argmax.

Exact in what arithmetic: the argument above is about the target's distribution, and holds
exactly when a verify pass computes the same logits as single steps. In exact arithmetic it does.
In floating point a pass over k+1 tokens adds up the same products in another order (other matmul
blockings, another attention kernel), so its logits differ from single steps' by rounding: about
1e-7 of their size in fp32, about one bf16 step (2^-8 of their size) in bf16. Greedy output is
therefore identical to plain greedy decoding in fp32 unless two top logits tie to within about
1e-7; in bf16 or fp16 the argmax can flip where the top two logits are within a rounding step or
two of each other, and the text then continues differently from there. That is rounding, not a
broken acceptance rule: each flip sits at such a near-tie (tests/test_speculative.py measures it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from memwall.engine.drafts import Draft, Proposal
from memwall.engine.phases import _sync
from memwall.engine.sampling import Sampling, make_generator, probabilities

# (p [k+1, V], q [k, V], guesses [k], generator) -> (number of guesses accepted, the token after them)
AcceptanceRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, "torch.Generator | None"], tuple[int, int]
]


def exact_acceptance(p, q, guesses, generator=None) -> tuple[int, int]:
    """The exact rule: accept while u < p/q; then sample the residual, or a bonus token from p[k]."""
    k = len(guesses)
    rows = torch.arange(k, device=p.device)
    p_guess, q_guess = p[rows, guesses], q[rows, guesses]
    u = torch.rand(k, generator=generator, device=p.device)
    accepted = (
        u * q_guess < p_guess
    )  # u < p/q without dividing; q(guess) > 0 since it was drawn from q
    n = int(accepted.long().cumprod(0).sum())  # guesses before the first rejection
    if n == k:
        return n, _draw(p[k], generator)
    residual = (p[n] - q[n]).clamp(min=0)
    if residual.sum() <= 0:  # p == q up to rounding: a rejection then has probability ~0 anyway
        residual = p[n]
    return n, _draw(residual, generator)


def greedy_acceptance(target_logits, guesses) -> tuple[int, int]:
    """Keep guesses while they equal the target's argmax; then emit the target's argmax."""
    best = target_logits.argmax(-1)  # [k+1]
    matches = (best[: len(guesses)] == guesses).long()
    n = int(matches.cumprod(0).sum())
    return n, int(best[n])


def _draw(weights, generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))


def point_masses(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q for a deterministic draft: all of each row's mass on its token."""
    q = torch.zeros(len(tokens), vocab_size, device=tokens.device)
    q[torch.arange(len(tokens), device=tokens.device), tokens] = 1.0
    return q


@dataclass
class SpeculativeGeneration:
    tokens: list[int]  # generated tokens (prompt excluded)
    tokens_per_pass: list[int] = field(default_factory=list)  # tokens each verify pass produced
    proposed: int = 0  # guesses the draft made
    accepted: int = 0  # guesses the target kept
    rejected: int = 0  # rounds that ended in a rejection
    draft_s: float = 0.0  # time spent in the draft
    verify_s: float = 0.0  # time spent in target passes (prefill excluded)
    prefill_s: float = 0.0
    total_s: float = 0.0

    @property
    def target_passes(self) -> int:
        return len(self.tokens_per_pass)

    @property
    def acceptance_rate(self) -> float:
        """alpha: the fraction of guesses accepted among those the rule actually tested. Guesses
        after a rejection are never tested, so they are left out (the estimate the formula needs)."""
        tested = self.accepted + self.rejected
        return self.accepted / tested if tested else float("nan")

    @property
    def mean_tokens_per_pass(self) -> float:
        return sum(self.tokens_per_pass) / max(1, self.target_passes)


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): tokens per target pass if each guess is accepted
    independently with probability alpha (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@torch.inference_mode()
def speculative_generate(
    target,
    draft: Draft,
    prompt_ids,
    max_new_tokens: int,
    k: int = 4,
    sampling: Sampling = Sampling(),
    stop_tokens=(),
    acceptance: AcceptanceRule = exact_acceptance,
) -> SpeculativeGeneration:
    """Generate like `generate(target, ...)`, with `draft` proposing up to k tokens per target pass.

    Greedy (temperature 0) gives the target's own greedy tokens; sampling gives tokens distributed
    exactly as the target's, provided `acceptance` is the exact rule (tests pass broken ones).
    "Own greedy tokens" up to float rounding (module docstring): identical in fp32 except at
    logits tied to about 1e-7; in bf16 a near-tie (within a rounding step) may be broken the other
    way, after which the two texts differ.
    """
    device = next(target.parameters()).device
    context = [int(t) for t in torch.as_tensor(prompt_ids).reshape(-1).tolist()]
    if not context:
        raise ValueError("the prompt is empty; give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if k < 1:
        raise ValueError(f"k (tokens drafted per pass) must be >= 1, got {k}")
    capacity = len(context) + max_new_tokens + k + 1
    if capacity > target.max_positions:
        raise ValueError(
            f"prompt ({len(context)}) + max_new_tokens ({max_new_tokens}) + k + 1 exceeds "
            f"the model's context of {target.max_positions} tokens"
        )
    vocab = target.lm_head.out_features
    if getattr(draft, "vocab_size", vocab) != vocab:
        raise ValueError(
            f"the draft's vocabulary ({draft.vocab_size} tokens) differs from the target's ({vocab}); "
            "a draft model must share the target's tokenizer"
        )
    cache = target.new_cache(batch=1, max_tokens=capacity)
    draft.reset(capacity)
    generator = make_generator(sampling, device)
    out = SpeculativeGeneration(tokens=[])
    start = time.perf_counter()

    # The cache holds every context token but the last; each verify pass feeds that one plus the guesses.
    if len(context) > 1:
        target(torch.tensor([context[:-1]], device=device), cache, last_only=True)
    _sync(device)  # a GPU queues the prefill: without the wait it would count as decode time
    out.prefill_s = time.perf_counter() - start
    while len(out.tokens) < max_new_tokens:
        t0 = time.perf_counter()
        room = max_new_tokens - len(out.tokens) - 1  # never draft past the requested length
        proposal = draft.propose(context, min(k, room), sampling, generator)
        t1 = time.perf_counter()
        n, token = verify(
            target, cache, context[-1], proposal, sampling, generator, acceptance, vocab
        )
        out.verify_s += time.perf_counter() - t1
        out.draft_s += t1 - t0
        out.proposed += len(proposal)
        out.accepted += n
        out.rejected += n < len(proposal)
        produced = proposal.tokens[:n] + [token]
        cache.rollback(len(context) + n)  # keep the fed token and the accepted guesses
        context += produced
        stop = next((i for i, t in enumerate(produced) if t in stop_tokens), None)
        if stop is not None:
            produced = produced[: stop + 1]
        out.tokens += produced
        out.tokens_per_pass.append(len(produced))
        if stop is not None:
            break
    out.total_s = time.perf_counter() - start
    return out


def verify(
    target,
    cache,
    last_token: int,
    proposal: Proposal,
    sampling,
    generator,
    acceptance: AcceptanceRule,
    vocab: int,
) -> tuple[int, int]:
    """One target pass over [last_token, guesses...]: how many guesses survive, and the next token."""
    device = next(target.parameters()).device  # any cache kind: readable, quantized, static
    fed = torch.tensor([[last_token, *proposal.tokens]], device=device)
    logits = target(fed, cache)[
        0
    ]  # [k+1, vocab]: the target's next-token logits after each fed token
    guesses = torch.tensor(proposal.tokens, dtype=torch.long, device=device)
    if sampling.greedy:
        return greedy_acceptance(logits, guesses)
    p = probabilities(logits, sampling)
    if not len(proposal):
        return 0, _draw(p[0], generator)
    q = proposal.probs if proposal.probs is not None else point_masses(guesses, vocab)
    return acceptance(p, q.to(p.dtype), guesses, generator)
