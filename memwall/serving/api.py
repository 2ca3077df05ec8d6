"""The OpenAI request and response formats: check a request body, build the response bodies.

Errors come back as OpenAI does: an HTTP status and {"error": {"message", "type", "param",
"code"}}. Parameters memwall does not implement (logprobs, penalties, n > 1, ...) are refused with
a 400 that says so, rather than silently ignored. `ignore_eos` is accepted as an extension for
benchmarks, as vLLM does: the request then runs to max_tokens.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from memwall.engine.sampling import Sampling

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_STRINGS = 4
# Parameters accepted only at their "off" value: anything else is refused, not ignored.
UNSUPPORTED = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "functions": (None, []),
    "response_format": (None, {"type": "text"}),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param=None, code=None, kind=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Params:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _number(body, name, default, low, high, integer=False):
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise bad(f"'{name}' must be {kind} between {low} and {high}, got {value!r}", name)
    return value


def _flag(body, name) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be true or false, got {value!r}", name)
    return value


def _stop_strings(body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise bad(f"'stop' must be a string or a list of up to {MAX_STOP_STRINGS} strings", "stop")
    return stops


def _text(text: str, param: str) -> str:
    """`text` if it can be encoded (JSON's \\ud800 escapes decode to lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(
            f"'{param}' holds a lone surrogate (\\ud800-\\udfff), which is not text", param
        ) from None
    return text


def _completion_prompt(body, tokenizer, vocab_size) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return list(tokenizer(_text(prompt, "prompt")).input_ids)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if not all(0 <= t < vocab_size for t in prompt):
            raise bad(f"prompt token ids must lie in [0, {vocab_size})", "prompt")
        return prompt
    raise bad(
        "'prompt' must be a non-empty string or list of token ids (one prompt per request)",
        "prompt",
    )


def _chat_prompt(body, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    plain = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad("each message must be an object with a 'role' and a 'content'", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is served
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise bad("only text content parts are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise bad("each message's 'content' must be a string", "messages")
        plain.append({"role": message["role"], "content": _text(content, "messages")})
    try:
        ids = tokenizer.apply_chat_template(
            plain, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    except Exception as error:  # a template may refuse a role or an order of messages
        raise bad(
            f"the model's chat template refused these messages: {error}", "messages"
        ) from None
    return list(ids)


def parse(
    body,
    chat: bool,
    tokenizer,
    model_name: str,
    max_tokens_limit: int,
    vocab_size: int,
    longest_token: int | None = None,
):
    """Check a request body; return Params or raise ApiError (400, or 404 for an unknown model).
    `longest_token`: the most characters one token covers; a prompt with more characters than
    that many tokens could hold is refused before it is tokenized (which takes seconds)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {model!r}", "model")
    if model is not None and model != model_name:
        raise ApiError(
            404,
            f"The model {model!r} does not exist; this server serves {model_name!r}.",
            param="model",
            code="model_not_found",
        )
    for name, allowed in UNSUPPORTED.items():
        if name in body and body[name] not in allowed:
            raise bad(f"'{name}' is not supported by memwall serve", name)
    if _number(body, "n", 1, 1, 128, integer=True) != 1:
        raise bad("n > 1 is not supported: send one request per choice", "n")
    sampling = Sampling(
        temperature=float(_number(body, "temperature", 1.0, 0, 2)),  # OpenAI: 1
        top_p=float(_number(body, "top_p", 1.0, 1e-9, 1)),
        seed=_number(body, "seed", None, -(2**63), 2**64 - 1, integer=True),
    )
    if longest_token and _characters(body.get("messages" if chat else "prompt")) > (
        max_tokens_limit * longest_token
    ):
        raise ApiError(
            400,
            f"the prompt is longer than this server's limit of {max_tokens_limit} tokens",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    prompt = (
        _chat_prompt(body, tokenizer) if chat else _completion_prompt(body, tokenizer, vocab_size)
    )
    room = max_tokens_limit - len(prompt)
    if room < 1:
        raise bad(
            f"the prompt is {len(prompt)} tokens; this server takes at most "
            f"{max_tokens_limit - 1} (prompt + max_tokens <= {max_tokens_limit})",
            "messages" if chat else "prompt",
        )
    limit_name = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    default = room if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, room)
    max_tokens = _number(body, limit_name, default, 1, 2**31, integer=True)
    if len(prompt) + max_tokens > max_tokens_limit:
        raise ApiError(
            400,
            f"prompt ({len(prompt)} tokens) + {limit_name} ({max_tokens}) exceeds this server's "
            f"limit of {max_tokens_limit} tokens per request",
            param=limit_name,
            code="context_length_exceeded",
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    return Params(
        chat=chat,
        prompt_ids=prompt,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=_stop_strings(body),
        stream=_flag(body, "stream"),
        include_usage=_flag(options or {}, "include_usage"),
        ignore_eos=_flag(body, "ignore_eos"),
    )


def _characters(value) -> int:
    """Characters of text in a prompt or a list of messages (0 for anything else)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_characters(part) for part in value.values())
    if isinstance(value, list):
        return sum(_characters(part) for part in value)
    return 0


# ---- response bodies --------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(chat, request_id, model, text, finish_reason, token_usage) -> dict:
    choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": token_usage,
    }


def chunk(chat, request_id, model, text=None, finish_reason=None, first=False, token_usage=None):
    """One server-sent event's JSON; with token_usage alone it is the final usage chunk."""
    body = {
        "id": request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
    }
    if token_usage is not None:
        body["usage"] = token_usage
        return body
    if chat:
        delta = {"role": "assistant", "content": text or ""} if first else {"content": text or ""}
        if finish_reason and not text:
            delta = {}
        choice = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": text or ""}
    body["choices"] = [{**choice, "logprobs": None, "finish_reason": finish_reason}]
    return body
