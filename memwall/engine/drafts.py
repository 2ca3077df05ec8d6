"""Drafts for speculative decoding: cheap guessers whose tokens the target model then verifies.

A draft looks at the context so far and proposes the next k tokens, with the distribution q it
drew each one from (or no distribution, meaning "this exact token, with certainty"). Three kinds,
all of which run offline:

- `ModelDraft(model)`: a separate, smaller model with the same vocabulary (Leviathan et al. 2023;
  Chen et al. 2023), e.g. SmolLM2-135M drafting for SmolLM2-1.7B.
- `SelfDraft(target, n_layers)`: the target's own first N layers, then its final norm and head:
  an "early exit" draft. It shares the target's weights, so it costs no extra memory. Published
  self-speculative methods choose which layers to skip by search (Zhang et al. 2024, "Draft &
  Verify") or train the model to exit early (Elhoushi et al. 2024, "LayerSkip"); an off-the-shelf
  model's first layers, read through its head, guess much worse (chapter 8 measures how much).
- `PromptLookupDraft(ngram)`: no model at all. It finds the latest earlier occurrence of the
  context's last n-gram and proposes the tokens that followed it (prompt lookup decoding,
  Saxena 2023). Free to run, and good when the output quotes the input.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from memwall.engine.sampling import Sampling, probabilities


@dataclass
class Proposal:
    tokens: list[int]  # the proposed next tokens (may be fewer than asked, even none)
    probs: torch.Tensor | None = None  # [len(tokens), vocab]: q for each token; None = point masses

    def __len__(self) -> int:
        return len(self.tokens)


class Draft(ABC):
    """Proposes tokens for a target model to verify. Subclasses keep whatever state they need."""

    def reset(self, max_tokens: int) -> None:
        """Start a new sequence of at most `max_tokens` tokens (prompt, output and proposals)."""
        return None  # stateless drafts need nothing

    @abstractmethod
    def propose(
        self,
        context: list[int],
        k: int,
        sampling: Sampling,
        generator: torch.Generator | None = None,
    ) -> Proposal:
        """Up to k tokens to follow `context` (the prompt plus everything accepted so far)."""


class ModelDraft(Draft):
    """A separate small model (same vocabulary as the target) with its own KV cache.

    The draft remembers which tokens its cache holds. Each call rolls the cache back to the part
    that still agrees with the context (rejected guesses are forgotten), feeds the tokens it has not
    seen in one pass, then decodes k tokens one at a time, drawing each from q (or taking the argmax).
    """

    def __init__(self, model):
        self.model = model
        self.cache = None
        self.cached_tokens: list[int] = []

    @property
    def vocab_size(self) -> int:
        return self.model.lm_head.out_features

    def reset(self, max_tokens: int) -> None:
        self.cache = self.model.new_cache(batch=1, max_tokens=max_tokens)
        self.cached_tokens = []

    @torch.inference_mode()
    def propose(self, context, k, sampling, generator=None) -> Proposal:
        if self.cache is None:
            raise ValueError("call reset(max_tokens) before propose()")
        if k <= 0:
            return Proposal([])
        keep = _common_prefix(self.cached_tokens, context)
        keep = min(keep, len(context) - 1)  # re-feed at least one token: we need its logits
        self.cache.rollback(keep)
        device = next(self.model.parameters()).device
        fresh = torch.tensor([context[keep:]], device=device)
        logits = self.model(fresh, self.cache, last_only=True)[:, -1]
        self.cached_tokens = list(context)
        tokens, dists = [], []
        for i in range(k):
            if sampling.greedy:
                token = int(logits.argmax(-1))
            else:
                q = probabilities(logits, sampling)[0]
                token = int(torch.multinomial(q, 1, generator=generator))
                dists.append(q)
            tokens.append(token)
            if i + 1 < k:  # the last guess need not be fed: the target checks it
                logits = self.model(torch.tensor([[token]], device=device), self.cache)[:, -1]
                self.cached_tokens.append(token)
        return Proposal(tokens, torch.stack(dists) if dists else None)


class SelfDraft(ModelDraft):
    """The target's first `n_layers` blocks, then its final norm and LM head, as a draft model."""

    def __init__(self, target, n_layers: int):
        if not 1 <= n_layers <= target.n_layers:
            raise ValueError(
                f"n_layers must be between 1 and the target's {target.n_layers}, got {n_layers}"
            )
        super().__init__(first_layers(target, n_layers))
        self.n_layers = n_layers


def first_layers(model, n_layers: int):
    """A view of `model` that runs only its first `n_layers` blocks; every weight is shared."""
    view = copy.copy(model)  # a shallow copy: same parameters, but its own module table
    view._modules = dict(model._modules)
    view._modules["blocks"] = nn.ModuleList(list(model.blocks)[:n_layers])
    view.n_layers = n_layers
    return view


class PromptLookupDraft(Draft):
    """Propose what followed the latest earlier occurrence of the context's last n-gram.

    Tries n-grams of length `ngram` down to 1 and uses the longest that matches. The proposal is
    deterministic (probs None): the acceptance rule then keeps a token with probability p(token).
    """

    def __init__(self, ngram: int = 3):
        if ngram < 1:
            raise ValueError(f"ngram must be >= 1, got {ngram}")
        self.ngram = ngram

    def propose(self, context, k, sampling, generator=None) -> Proposal:
        if k <= 0:
            return Proposal([])
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            follow = lookup(context, n, k)
            if follow:
                return Proposal(follow)
        return Proposal([])


def lookup(context: list[int], n: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of context's last n tokens."""
    pattern = context[-n:]
    for start in range(
        len(context) - n - 1, -1, -1
    ):  # latest match first, excluding the pattern itself
        if context[start : start + n] == pattern:
            return context[start + n : start + n + k]
    return []


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


DRAFT_KINDS = ("self:N", "lookup:N", "model:NAME")


def parse_draft(text: str, target, load_model=None) -> Draft:
    """A draft from a short spec: 'self:8', 'lookup:3', or 'model:NAME' (NAME given to load_model)."""
    kind, _, arg = text.partition(":")
    try:
        if kind == "self":
            return SelfDraft(target, int(arg))
        if kind == "lookup":
            return PromptLookupDraft(int(arg or 3))
    except ValueError as error:
        raise ValueError(f"bad draft {text!r}: {error}") from None
    if kind == "model" and arg and load_model is not None:
        return ModelDraft(load_model(arg))
    raise ValueError(f"unknown draft {text!r}; valid forms: {', '.join(DRAFT_KINDS)}")
