"""Prefill and decode: the two phases of generation.

Prefill runs the whole prompt through the model in one pass and fills the KV cache; its time is
the time to first token (TTFT). Decode then produces one token per step, each step reading every
weight once plus the cache so far; its time is the time per output token (TPOT).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from memwall.engine.kv_cache import KVCache
from memwall.engine.sampling import Sampling, make_generator, sample


@dataclass
class Generation:
    tokens: list[int]  # generated token ids (prompt excluded)
    ttft_s: float  # prefill + first token
    step_times_s: list[float] = field(default_factory=list)  # one per decode step after the first


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def prefill(model, prompt: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the prompt [batch, tokens] and return next-token logits [batch, vocab]."""
    return model(prompt, cache, last_only=True)[:, -1]


@torch.inference_mode()
def decode_step(model, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One token per sequence [batch] in, next-token logits [batch, vocab] out."""
    return model(tokens[:, None], cache)[:, -1]


@torch.inference_mode()
def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    stop_tokens=(),
    cache: KVCache | None = None,
) -> Generation:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` (a list or 1-D tensor) for one sequence."""
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, device=device).reshape(1, -1)
    if prompt.shape[1] == 0:
        raise ValueError("the prompt is empty; give at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    needed = prompt.shape[1] + max_new_tokens
    if needed > model.max_positions:
        raise ValueError(
            f"prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {model.max_positions} tokens"
        )
    cache = cache or model.new_cache(batch=1, max_tokens=needed)
    generator = make_generator(sampling, device)

    start = time.perf_counter()
    token = sample(prefill(model, prompt, cache), sampling, generator)
    _sync(device)
    out = Generation(tokens=[int(token)], ttft_s=time.perf_counter() - start)
    while len(out.tokens) < max_new_tokens and out.tokens[-1] not in stop_tokens:
        step_start = time.perf_counter()
        token = sample(decode_step(model, token, cache), sampling, generator)
        out.tokens.append(int(token))  # int() waits for the device, so the timing is honest
        out.step_times_s.append(time.perf_counter() - step_start)
    return out
