"""Batched decoding: B sequences of different prompt lengths, one forward pass per step.

Every weight matrix is read once per step whatever the batch size, so B sequences decoded together
cost little more than one while decode is memory-bound (chapter 6; Pope et al. 2022). The
difficulty is that prompts differ in length, and a batch is a rectangle.

This module uses **left padding** on the contiguous `KVCache`: prompts are right-aligned, so every
sequence's newest token sits in the same cache slot and one slot index serves the whole batch.
Two things keep the padding invisible:
- positions: sequence b, padded by p_b slots, has its token in slot s at position s - p_b, so the
  rotary embedding sees exactly the positions it would see alone;
- the attention mask: a query never attends to a pad slot. A pad query attends to itself only,
  so no softmax row is empty (an empty row would give NaN, which would then leak through 0 x NaN).

The cost is the pad slots themselves: prefill computes them, and every decode step reads them.
The paged cache (`paged_cache.py`) avoids both with a ragged layout; the continuous-batching
scheduler uses that, because its sequences join at different times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

PAD_TOKEN = 0  # any valid id: pad slots are never attended to, so their content does not matter


@dataclass
class BatchGeneration:
    tokens: list[list[int]]  # generated ids per sequence (prompt excluded)
    prefill_s: float  # the batched prefill, first tokens included
    step_times_s: list[float] = field(default_factory=list)  # one per batched decode step


def left_pad(prompts: list[list[int]], pad: int = PAD_TOKEN) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-align the prompts: tokens [batch, longest] and the pad count of each row [batch]."""
    longest = max(len(p) for p in prompts)
    pads = torch.tensor([longest - len(p) for p in prompts])
    tokens = torch.tensor([[pad] * (longest - len(p)) + list(p) for p in prompts])
    return tokens, pads


def prefill_positions_and_mask(
    pads: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [batch, length] and mask [batch, 1, length, length] for a left-padded prefill."""
    slots = torch.arange(length)
    positions = (slots[None, :] - pads[:, None]).clamp(min=0)
    query, key = slots[:, None], slots[None, :]
    real_key = key[None] >= pads[:, None, None]  # [batch, 1, length]
    mask = ((key <= query)[None] & real_key) | (key == query)[None]
    return positions, mask[:, None]


def decode_positions_and_mask(pads: torch.Tensor, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [batch, 1] and mask [batch, 1, 1, slot + 1] for the token written at cache `slot`."""
    positions = (slot - pads)[:, None]
    mask = torch.arange(slot + 1)[None, :] >= pads[:, None]
    return positions, mask[:, None, None]


def _check(prompts, max_new_tokens, model) -> None:
    if not prompts:
        raise ValueError("give at least one prompt")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.max_positions:
        raise ValueError(
            f"longest prompt ({longest}) + max_new_tokens ({max_new_tokens}) exceeds "
            f"the model's context of {model.max_positions} tokens"
        )


@torch.inference_mode()
def generate_batch(model, prompts, max_new_tokens: int, stop_tokens=()) -> BatchGeneration:
    """Greedy-decode every prompt together; each sequence gets the tokens it would get alone.

    A sequence that emits a stop token is finished, but stays in the batch (its later tokens are
    discarded) until every sequence is done: this is static batching, and that idle slot is the
    waste that continuous batching (`scheduler.py`) removes.
    """
    prompts = [list(map(int, p)) for p in prompts]
    _check(prompts, max_new_tokens, model)
    device = next(model.parameters()).device
    tokens, pads = left_pad(prompts)
    batch, length = tokens.shape
    ragged = bool(pads.any())  # equal lengths need no mask, and take the plain decode path
    cache = model.new_cache(batch=batch, max_tokens=length + max_new_tokens)

    start = time.perf_counter()
    if ragged:
        positions, mask = prefill_positions_and_mask(pads, length)
        logits = model(
            tokens.to(device),
            cache,
            positions=positions.to(device),
            mask=mask.to(device),
            last_only=True,
        )
    else:
        logits = model(tokens.to(device), cache, last_only=True)
    next_tokens = logits[:, -1].argmax(-1)
    out = BatchGeneration(
        tokens=[[t] for t in next_tokens.tolist()], prefill_s=time.perf_counter() - start
    )
    done = [t in stop_tokens for t in next_tokens.tolist()]

    for _ in range(max_new_tokens - 1):
        if all(done):
            break
        step_start = time.perf_counter()
        if ragged:
            positions, mask = decode_positions_and_mask(pads, cache.length)
            logits = model(
                next_tokens[:, None], cache, positions=positions.to(device), mask=mask.to(device)
            )
        else:
            logits = model(next_tokens[:, None], cache)
        next_tokens = logits[:, -1].argmax(-1)
        new = next_tokens.tolist()  # waits for the device, so the step time is honest
        out.step_times_s.append(time.perf_counter() - step_start)
        for row, token in enumerate(new):
            if not done[row]:
                out.tokens[row].append(token)
                done[row] = token in stop_tokens
    return out
