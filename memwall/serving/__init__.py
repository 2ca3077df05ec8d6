"""Serving: a small OpenAI-compatible server around memwall's engine, and a load generator that
measures TTFT and TPOT of any OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, this one)."""
