"""Model shapes: what a transformer's config says, and how many parameters that makes.

A `ModelSpec` holds the handful of numbers that decide the bytes an inference step moves:
layers, hidden size, query and key/value heads, head dim, FFN size, vocabulary, and whether
the input embedding is shared with the output head. `CATALOG` copies them from the published
Hugging Face `config.json` files, and `n_params` reproduces the published parameter counts.

Two architectures are counted:
- "llama" (Llama 2/3, Mistral, Mixtral, Qwen2, SmolLM2): RMSNorm (weight only), no position
  table (RoPE), a gated FFN with three matrices (gate, up, down), optional q/k/v biases (Qwen2).
- "gpt2": LayerNorm (weight and bias), a learned position table, biases on every linear, and a
  plain FFN with two matrices.

No torch here: this module is imported by the pure-arithmetic cost model.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

ARCHITECTURES = ("llama", "gpt2")

# Hugging Face model_type -> our architecture family.
_LLAMA_LIKE_MODEL_TYPES = ("llama", "mistral", "qwen2", "mixtral")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, enough to count its parameters and cache."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    tied_embeddings: bool
    max_context: int
    arch: str = "llama"
    # Mixture of experts: each layer has n_experts FFNs, and a router picks n_active_experts per token.
    n_experts: int = 1
    n_active_experts: int = 1
    # Qwen2 puts biases on the q, k and v projections (not on o); they change the count by ~0.1%.
    qkv_bias: bool = False
    # Not needed for counting, but the engine and random_init need them to build a faithful model.
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for field in (
            "n_layers",
            "d_model",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "d_ff",
            "vocab_size",
            "max_context",
            "n_experts",
            "n_active_experts",
        ):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{self.name}: {field} must be a positive integer, got {value!r}.")
        if self.arch not in ARCHITECTURES:
            raise ValueError(
                f"{self.name}: unknown arch {self.arch!r}; choose from {', '.join(ARCHITECTURES)}."
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads}), so that each KV head serves a whole group of query heads."
            )
        if self.n_active_experts > self.n_experts:
            raise ValueError(
                f"{self.name}: n_active_experts ({self.n_active_experts}) exceeds "
                f"n_experts ({self.n_experts})."
            )
        if self.arch == "gpt2" and (self.n_kv_heads != self.n_heads or self.n_experts != 1):
            raise ValueError(f"{self.name}: gpt2 has plain multi-head attention and no experts.")

    # ---- parameter counts -------------------------------------------------------------------

    @property
    def n_embedding_params(self) -> int:
        """Input tables: token embeddings, plus GPT-2's learned position embeddings."""
        tokens = self.vocab_size * self.d_model
        positions = self.max_context * self.d_model if self.arch == "gpt2" else 0
        return tokens + positions

    @property
    def n_lm_head_params(self) -> int:
        """Weights of the output projection to the vocabulary, whether or not they are shared."""
        return self.vocab_size * self.d_model

    @property
    def n_attention_params_per_layer(self) -> int:
        q_out = self.n_heads * self.head_dim
        kv_out = self.n_kv_heads * self.head_dim
        weights = self.d_model * (q_out + 2 * kv_out) + q_out * self.d_model
        if self.arch == "gpt2":
            return weights + (q_out + 2 * kv_out) + self.d_model  # biases on c_attn and c_proj
        return weights + ((q_out + 2 * kv_out) if self.qkv_bias else 0)

    @property
    def n_ffn_params_per_expert(self) -> int:
        if self.arch == "gpt2":
            return (
                2 * self.d_model * self.d_ff + self.d_ff + self.d_model
            )  # c_fc and c_proj, with biases
        return 3 * self.d_model * self.d_ff  # gate, up, down

    @property
    def n_router_params_per_layer(self) -> int:
        return self.d_model * self.n_experts if self.n_experts > 1 else 0

    @property
    def n_norm_params_per_layer(self) -> int:
        per_norm = 2 * self.d_model if self.arch == "gpt2" else self.d_model  # LayerNorm has a bias
        return 2 * per_norm

    @property
    def n_final_norm_params(self) -> int:
        return 2 * self.d_model if self.arch == "gpt2" else self.d_model

    def _count(self, experts_per_layer: int) -> int:
        per_layer = (
            self.n_attention_params_per_layer
            + self.n_norm_params_per_layer
            + self.n_router_params_per_layer
            + experts_per_layer * self.n_ffn_params_per_expert
        )
        head = 0 if self.tied_embeddings else self.n_lm_head_params
        return self.n_embedding_params + self.n_layers * per_layer + self.n_final_norm_params + head

    @property
    def n_params(self) -> int:
        """All parameters stored, every expert included (what has to fit in memory)."""
        return self._count(self.n_experts)

    @property
    def n_params_active(self) -> int:
        """Parameters one token uses: only the experts the router picks (equals n_params if dense)."""
        return self._count(self.n_active_experts)

    # ---- variants and constructors ------------------------------------------------------------

    def with_kv_heads(self, n_kv_heads: int) -> ModelSpec:
        """The same model with another KV-head count: n_heads is MHA, 1 is MQA, in between is GQA."""
        suffix = f"-kv{n_kv_heads}" if n_kv_heads != self.n_kv_heads else ""
        return dataclasses.replace(self, n_kv_heads=n_kv_heads, name=self.name + suffix)

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> ModelSpec:
        """Build a spec from a Hugging Face config: a dict, a path to config.json (or its folder),
        or a transformers `PretrainedConfig`."""
        cfg = _config_as_dict(config)
        model_type = cfg.get("model_type")
        name = (
            name or cfg.get("_name_or_path") or cfg.get("name_or_path") or model_type or "unnamed"
        )
        if model_type == "gpt2":
            d_model = cfg["n_embd"]
            return cls(
                name=name,
                arch="gpt2",
                n_layers=cfg["n_layer"],
                d_model=d_model,
                n_heads=cfg["n_head"],
                n_kv_heads=cfg["n_head"],
                head_dim=d_model // cfg["n_head"],
                d_ff=cfg.get("n_inner") or 4 * d_model,
                vocab_size=cfg["vocab_size"],
                tied_embeddings=True,
                max_context=cfg["n_positions"],
                norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
            )
        if model_type not in _LLAMA_LIKE_MODEL_TYPES:
            raise ValueError(
                f"Unsupported model_type {model_type!r}; choose from "
                f"{', '.join(_LLAMA_LIKE_MODEL_TYPES + ('gpt2',))}."
            )
        d_model, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
        n_experts = cfg.get("num_local_experts") or 1
        return cls(
            name=name,
            arch="llama",
            n_layers=cfg["num_hidden_layers"],
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
            # Mistral's config writes head_dim: null, meaning hidden_size / heads.
            head_dim=cfg.get("head_dim") or d_model // n_heads,
            d_ff=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_context=cfg["max_position_embeddings"],
            n_experts=n_experts,
            n_active_experts=(cfg.get("num_experts_per_tok") or 1) if n_experts > 1 else 1,
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        )


def _config_as_dict(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    if isinstance(config, (str, PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"No config.json at {path}.")
        return json.loads(path.read_text())
    if hasattr(config, "to_dict"):  # a transformers PretrainedConfig
        return config.to_dict()
    raise ValueError(
        f"Expected a dict, a path to config.json or a transformers config, got {type(config).__name__}."
    )


def _llama(
    name,
    n_layers,
    d_model,
    n_heads,
    n_kv_heads,
    d_ff,
    vocab_size,
    max_context,
    *,
    tied=False,
    head_dim=None,
    **extra,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim or d_model // n_heads,
        d_ff=d_ff,
        vocab_size=vocab_size,
        tied_embeddings=tied,
        max_context=max_context,
        **extra,
    )


# Numbers copied from each model's published config.json on the Hugging Face hub.
# Context lengths are max_position_embeddings of the base model (RoPE scaling is not modelled).
CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, rope_theta=500000.0),
        _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072, rope_theta=500000.0),
        _llama(
            "llama-3.2-1b",
            16,
            2048,
            32,
            8,
            8192,
            128256,
            131072,
            tied=True,
            head_dim=64,
            rope_theta=500000.0,
        ),
        _llama(
            "llama-3.2-3b",
            28,
            3072,
            24,
            8,
            8192,
            128256,
            131072,
            tied=True,
            head_dim=128,
            rope_theta=500000.0,
        ),
        _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),  # v0.1
        _llama(
            "mixtral-8x7b",
            32,
            4096,
            32,
            8,
            14336,
            32000,
            32768,
            n_experts=8,
            n_active_experts=2,
            rope_theta=1e6,
        ),
        _llama(
            "qwen2.5-0.5b",
            24,
            896,
            14,
            2,
            4864,
            151936,
            32768,
            tied=True,
            qkv_bias=True,
            rope_theta=1e6,
            norm_eps=1e-6,
        ),
        _llama(
            "qwen2.5-7b",
            28,
            3584,
            28,
            4,
            18944,
            152064,
            131072,
            qkv_bias=True,
            rope_theta=1e6,
            norm_eps=1e-6,
        ),
        _llama(
            "qwen2.5-72b",
            80,
            8192,
            64,
            8,
            29568,
            152064,
            131072,
            qkv_bias=True,
            rope_theta=1e6,
            norm_eps=1e-6,
        ),
        _llama("smollm2-135m", 30, 576, 9, 3, 1536, 49152, 8192, tied=True, rope_theta=100000.0),
        _llama("smollm2-360m", 32, 960, 15, 5, 2560, 49152, 8192, tied=True, rope_theta=100000.0),
        _llama("smollm2-1.7b", 24, 2048, 32, 32, 8192, 49152, 8192, tied=True, rope_theta=130000.0),
        ModelSpec(
            name="gpt2",
            arch="gpt2",
            n_layers=12,
            d_model=768,
            n_heads=12,
            n_kv_heads=12,
            head_dim=64,
            d_ff=3072,
            vocab_size=50257,
            tied_embeddings=True,
            max_context=1024,
        ),
    )
}


def get_spec(name_or_spec: str | ModelSpec) -> ModelSpec:
    """A catalog spec by (case-insensitive) name; a ModelSpec passes through unchanged."""
    if isinstance(name_or_spec, ModelSpec):
        return name_or_spec
    key = str(name_or_spec).strip().lower()
    if key not in CATALOG:
        raise ValueError(f"Unknown model {name_or_spec!r}; choose from {', '.join(CATALOG)}.")
    return CATALOG[key]
