"""Serving: `memwall serve`, an OpenAI-compatible server on the engine's continuous-batching scheduler
and paged KV cache (api: requests and responses; engine_loop: the one engine thread; text: streamed
detokenization; server: HTTP; interference: prefill/decode interference), and a load generator that
measures TTFT and TPOT of any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, this one)."""
