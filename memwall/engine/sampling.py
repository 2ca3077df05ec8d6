"""Turn logits into a token: greedy, temperature, and top-p (nucleus, Holtzman et al. 2020)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Below this, logits / T overflow float32 (or T rounds to 0): the T -> 0 limit, greedy, is taken.
GREEDY_BELOW = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise ValueError(f"seed must lie in [-2**63, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def probabilities(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The distribution a token is drawn from: softmax(logits / T), cut to the top-p nucleus."""
    logits = logits.float()
    # The largest logit becomes 0 first, so a small T sends the others to -inf, never to NaN.
    probs = torch.softmax((logits - logits.amax(-1, keepdim=True)) / sampling.temperature, -1)
    if sampling.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the token that crosses it is kept).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= sampling.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits [batch, vocab] -> token ids [batch]."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = probabilities(logits, sampling)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(sampling: Sampling, device) -> torch.Generator | None:
    if sampling.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
    return generator
