"""Serving: `memwall serve`, an OpenAI-compatible server on the engine's continuous-batching scheduler
and paged KV cache. api: requests and responses; engine_loop: the one engine thread; answer: one
request's tokens as text (text: streamed detokenization with stop strings); handler: HTTP routes
and the access log; access: the API key and CORS; metrics: /metrics in Prometheus' format;
shutdown: graceful shutdown on SIGTERM/SIGINT; server: start_server; cli: `memwall serve`.
What measures a server lives in memwall.bench: `load` (TTFT and TPOT of any OpenAI-compatible
endpoint) and `interference` (prefill/decode interference on this one)."""
