"""memwall's readable inference engine: a Llama-family model, an explicit KV cache, prefill/decode."""

from memwall.engine.kv_cache import KVCache
from memwall.engine.model import Transformer, causal_mask
from memwall.engine.phases import Generation, decode_step, generate, prefill
from memwall.engine.sampling import Sampling, probabilities, sample

__all__ = [
    "Generation",
    "KVCache",
    "Sampling",
    "Transformer",
    "causal_mask",
    "decode_step",
    "generate",
    "prefill",
    "probabilities",
    "sample",
]
