"""Serving: `memwall serve`, an OpenAI-compatible server on the engine's continuous-batching scheduler
and paged KV cache (api: requests and responses; engine_loop: the one engine thread; text: streamed
detokenization; server: HTTP). What measures a server lives in memwall.bench: `load` (TTFT and TPOT
of any OpenAI-compatible endpoint) and `interference` (prefill/decode interference on this one)."""
