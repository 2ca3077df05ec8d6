"""A minimal OpenAI-compatible completions server for memwall's engine, with streaming.

It serves one request at a time (a lock around the engine), so under concurrency the queueing
shows up in the time to first token, as it would on any server without batching. It exists so
that `memwall bench serve` can be tested offline against a real streaming endpoint; for serious
serving use vLLM, SGLang or llama.cpp and point the same benchmark at them.

Endpoints: POST /v1/completions and /v1/chat/completions (fields: prompt or messages,
max_tokens, temperature, top_p, seed, stream), GET /v1/models.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from memwall.engine import Sampling, Transformer, decode_step, prefill, sample
from memwall.engine.sampling import make_generator

MAX_TOKENS_LIMIT = 4096


class EngineService:
    """Turns request fields into streamed text pieces, one engine call at a time."""

    def __init__(self, engine: Transformer, tokenizer, model_name: str):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.lock = threading.Lock()

    def prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("'prompt' must be a non-empty string")
        return self.tokenizer(prompt).input_ids

    def stream(self, ids: list[int], max_tokens: int, sampling: Sampling):
        """Yield (token_id, text piece) as the engine produces them."""
        import torch

        if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be between 1 and {MAX_TOKENS_LIMIT}")
        if len(ids) + max_tokens > self.engine.max_positions:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens exceeds the context of "
                f"{self.engine.max_positions}"
            )
        stop = {self.tokenizer.eos_token_id}
        with self.lock, torch.inference_mode():
            cache = self.engine.new_cache(max_tokens=len(ids) + max_tokens)
            generator = make_generator(sampling, "cpu")
            token = sample(prefill(self.engine, torch.tensor([ids]), cache), sampling, generator)
            produced: list[int] = []
            for _ in range(max_tokens):
                token_id = int(token)
                if token_id in stop:
                    return
                # Decode the running text and emit the new suffix, so multi-token characters come out whole.
                before = self.tokenizer.decode(produced)
                produced.append(token_id)
                yield token_id, self.tokenizer.decode(produced)[len(before) :]
                if len(produced) < max_tokens:
                    token = sample(decode_step(self.engine, token, cache), sampling, generator)


def make_handler(service: EngineService):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test and benchmark output clean
            pass

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                self._json(
                    200, {"object": "list", "data": [{"id": service.model_name, "object": "model"}]}
                )
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            chat = self.path.rstrip("/") == "/v1/chat/completions"
            if not chat and self.path.rstrip("/") != "/v1/completions":
                return self._json(404, {"error": {"message": f"no route {self.path}"}})
            try:
                body = json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}"
                )
                ids = service.prompt_ids(body, chat)
                sampling = Sampling(
                    float(body.get("temperature", 0.0)),
                    float(body.get("top_p", 1.0)),
                    body.get("seed"),
                )
                pieces = service.stream(ids, int(body.get("max_tokens", 16)), sampling)
                if body.get("stream"):
                    self._stream(pieces, chat, len(ids))
                else:
                    text = "".join(piece for _, piece in pieces)
                    self._json(200, _completion(service.model_name, text, chat, len(ids)))
            except (ValueError, TypeError, json.JSONDecodeError) as error:
                self._json(400, {"error": {"message": str(error), "type": "invalid_request_error"}})

        def _json(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, pieces, chat, prompt_tokens):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            request_id, count = f"cmpl-{uuid.uuid4().hex[:12]}", 0
            for _, piece in pieces:
                count += 1
                chunk = {
                    "id": request_id,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": service.model_name,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": None,
                            **({"delta": {"content": piece}} if chat else {"text": piece}),
                        }
                    ],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count}
            self.wfile.write(
                f"data: {json.dumps({'id': request_id, 'choices': [], 'usage': usage})}\n\n".encode()
            )
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def _completion(model_name, text, chat, prompt_tokens):
    choice = {"index": 0, "finish_reason": "stop"}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens},
    }


def start_server(
    engine, tokenizer, model_name="smollm2-135m", host="127.0.0.1", port=0
) -> ThreadingHTTPServer:
    """Start serving in a background thread; returns the server (its URL port is server.server_port)."""
    server = ThreadingHTTPServer(
        (host, port), make_handler(EngineService(engine, tokenizer, model_name))
    )
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
