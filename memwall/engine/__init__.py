"""memwall's readable inference engine: a Llama-family model, an explicit KV cache, prefill/decode."""

from memwall._versions import require

require("torch")  # before the submodules import it, so an old torch gets a clear message

from memwall.engine.kv_cache import KVCache  # noqa: E402
from memwall.engine.model import Transformer, causal_mask  # noqa: E402
from memwall.engine.phases import Generation, decode_step, generate, prefill  # noqa: E402
from memwall.engine.sampling import Sampling, probabilities, sample  # noqa: E402
from memwall.engine.sharing import cast_copy, share_weights, shared_engine  # noqa: E402

__all__ = [
    "Generation",
    "KVCache",
    "Sampling",
    "Transformer",
    "cast_copy",
    "causal_mask",
    "decode_step",
    "generate",
    "prefill",
    "probabilities",
    "sample",
    "share_weights",
    "shared_engine",
]
