"""A request to the scheduler, its result, and its state while it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from memwall.engine.sampling import Sampling

FINISH_REASONS = ("stop", "length", "abort")  # the OpenAI names, plus a request its owner dropped


@dataclass
class Request:
    request_id: object
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int = 0  # the step at which it arrives (used by `run`)
    stop_tokens: tuple = ()
    sampling: Sampling = Sampling()  # greedy unless told otherwise


@dataclass
class Result:
    request_id: object
    tokens: list[int] = field(default_factory=list)
    error: str | None = None  # why it was rejected; None if it ran
    arrival_step: int = 0
    first_token_step: int | None = None
    finish_step: int | None = None
    preemptions: int = 0
    finish_reason: str | None = None  # one of FINISH_REASONS once it is done


@dataclass
class Running:
    request: Request
    result: Result
    admitted_step: int
    generator: torch.Generator | None = None
    context: list[int] = field(default_factory=list)  # what its prefill must put in the cache
    prefilled: int = 0  # tokens of `context` already in the cache

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.context)
