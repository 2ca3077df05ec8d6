"""How much a change to a model costs in quality: perplexity and top-1 agreement.

Perplexity is exp(mean negative log-likelihood) of each token given the ones before it: the
"effective number of choices" the model hesitates between. Lower is better; a change that leaves
the model's probabilities alone leaves it unchanged. Top-1 agreement is the fraction of positions
where a changed model's most likely next token equals a reference model's, a blunter measure that
does not care about the actual text.

Long texts are scored in windows (chunked, as in the sliding-window evaluation Hugging Face
describes for fixed-length models): each window of `window` tokens runs in one forward pass and
scores the targets not scored before it, so every token after the first is scored exactly once.
With `stride` < `window`, windows overlap and each scored token sees at least window - stride
tokens of context, at window / stride times the cost.

Works with memwall's engine `Transformer` or any callable model mapping token ids [1, T] to logits
[1, T, vocab] (or an object with `.logits`, like a transformers output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import torch

from memwall.validate import count

DEFAULT_WINDOW = 1024
ROWS_PER_CHUNK = 128
EVAL_TEXT = "eval_text.txt"


def eval_text() -> str:
    """The project's evaluation text: plain English prose on varied topics, written for memwall."""
    return resources.files("memwall.data").joinpath(EVAL_TEXT).read_text(encoding="utf-8")


def eval_token_ids(tokenizer, max_tokens: int | None = None) -> list[int]:
    """The evaluation text as token ids (optionally only the first `max_tokens`)."""
    ids = list(tokenizer(eval_text())["input_ids"])
    return ids[:max_tokens] if max_tokens else ids


@dataclass(frozen=True)
class Score:
    """Per-target results of one pass over a text: target i is token i + 1 of the text."""

    nll: torch.Tensor  # [targets] float64, -log p(token | tokens before it)
    predictions: torch.Tensor  # [targets] the most likely next token at each position
    targets: torch.Tensor  # [targets] the tokens that actually came next

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll.mean().item())

    @property
    def accuracy(self) -> float:
        """Fraction of positions where the top-1 prediction is the actual next token."""
        return (self.predictions == self.targets).double().mean().item()

    def agreement(self, reference: Score) -> float:
        """Fraction of positions where this model's top-1 prediction equals the reference's."""
        if not torch.equal(self.targets, reference.targets):
            raise ValueError(
                "the two scores are over different texts; score both models on the same token ids"
            )
        return (self.predictions == reference.predictions).double().mean().item()


@torch.inference_mode()
def score(model, token_ids, window: int = DEFAULT_WINDOW, stride: int | None = None) -> Score:
    """Score every token after the first: its negative log-likelihood and the top-1 prediction."""
    ids = _as_ids(token_ids)
    window = count("window", window)
    stride = window if stride is None else count("stride", stride)
    if stride > window:
        raise ValueError(
            f"stride ({stride}) must be <= window ({window}), or some tokens are never scored"
        )
    device = _device_of(model)
    nll, predictions = [], []
    scored, begin = 1, 0  # next target to score; token 0 has nothing before it
    while scored < len(ids):
        end = min(begin + window, len(ids))
        logits = _logits(model, ids[begin:end].to(device)[None])[0]
        last = min(end, len(ids) - 1)  # the logits at position end - 1 predict token `end`
        rows = logits[scored - 1 - begin : last - begin]
        targets = ids[scored : last + 1].to(rows.device)
        # A few rows at a time: log-probabilities over the whole window would be another copy of
        # its logits (200 MB for 1,024 tokens of a 49k vocabulary), too much for a small notebook.
        for chunk, chunk_targets in zip(rows.split(ROWS_PER_CHUNK), targets.split(ROWS_PER_CHUNK)):
            log_probs = torch.log_softmax(chunk.float(), dim=-1)
            nll.append(-log_probs.gather(1, chunk_targets[:, None])[:, 0].double().cpu())
            predictions.append(chunk.argmax(-1).cpu())
        del logits, rows
        scored, begin = last + 1, begin + stride
    return Score(torch.cat(nll), torch.cat(predictions), ids[1:].clone())


def perplexity(
    model, token_ids=None, window: int = DEFAULT_WINDOW, stride: int | None = None
) -> float:
    """exp(mean NLL) of `token_ids` under `model` (or of a `Score` already computed)."""
    return _score_of(model, token_ids, window, stride).perplexity


def top1_agreement(
    model, reference, token_ids=None, window: int = DEFAULT_WINDOW, stride: int | None = None
) -> float:
    """Fraction of positions where `model` and `reference` predict the same next token.

    Either may be a `Score` already computed on the same token ids, which saves a pass.
    """
    return _score_of(model, token_ids, window, stride).agreement(
        _score_of(reference, token_ids, window, stride)
    )


# ---- helpers -----------------------------------------------------------------------------------------


def _score_of(model_or_score, token_ids, window, stride) -> Score:
    if isinstance(model_or_score, Score):
        return model_or_score
    if token_ids is None:
        raise ValueError("pass token_ids to score a model (or pass a Score computed earlier)")
    return score(model_or_score, token_ids, window, stride)


def _as_ids(token_ids) -> torch.Tensor:
    ids = torch.as_tensor(token_ids, dtype=torch.long).reshape(-1).cpu()
    if len(ids) < 2:
        raise ValueError(f"need at least 2 tokens to score a next-token prediction, got {len(ids)}")
    return ids


def _device_of(model):
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    out = model(tokens)
    return out.logits if hasattr(out, "logits") else out
