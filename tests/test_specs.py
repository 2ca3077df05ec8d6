"""ModelSpec: published parameter counts, config parsing and input validation."""

import dataclasses
import json

import pytest

from memwall.specs import CATALOG, ModelSpec, get_spec

# Published parameter counts (model cards / papers), in parameters.
PUBLISHED = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 68.98e9,
    "llama-3-8b": 8.03e9,
    "llama-3-70b": 70.6e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9,
    "mistral-7b": 7.24e9,
    "qwen2.5-0.5b": 0.494e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "smollm2-135m": 134.5e6,
    "smollm2-360m": 361.8e6,
    "smollm2-1.7b": 1.71e9,
    "gpt2": 124.4e6,
    "mixtral-8x7b": 46.7e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name):
    assert CATALOG[name].n_params == pytest.approx(PUBLISHED[name], rel=0.01)


def test_catalog_covers_every_published_model():
    assert set(CATALOG) == set(PUBLISHED)


def test_smollm2_135m_count_is_exact():
    # The number of parameters in the SmolLM2-135M-Instruct checkpoint the course ships.
    assert CATALOG["smollm2-135m"].n_params == 134_515_008


def test_gpt2_count_is_exact():
    # wte + wpe + 12 blocks + ln_f, as in the original GPT-2 small checkpoint.
    assert CATALOG["gpt2"].n_params == 124_439_808


def test_mixtral_active_parameters():
    mixtral = CATALOG["mixtral-8x7b"]
    assert mixtral.n_params_active == pytest.approx(12.9e9, rel=0.01)
    assert mixtral.n_params_active < mixtral.n_params


def test_dense_models_have_all_parameters_active():
    assert all(s.n_params == s.n_params_active for s in CATALOG.values() if s.n_experts == 1)


def test_embedding_params():
    assert CATALOG["llama-3-8b"].n_embedding_params == 128256 * 4096
    assert CATALOG["gpt2"].n_embedding_params == (50257 + 1024) * 768  # tokens + positions


def test_tying_saves_one_table():
    untied = dataclasses.replace(CATALOG["llama-3.2-1b"], tied_embeddings=False)
    assert untied.n_params - CATALOG["llama-3.2-1b"].n_params == 128256 * 2048


def test_with_kv_heads_changes_only_kv_heads():
    spec = CATALOG["llama-3-8b"]
    mha, mqa = spec.with_kv_heads(32), spec.with_kv_heads(1)
    assert (mha.n_kv_heads, mqa.n_kv_heads) == (32, 1)
    assert mha.n_params > spec.n_params > mqa.n_params
    assert mqa.d_model == spec.d_model and mqa.n_heads == spec.n_heads
    assert spec.with_kv_heads(8) == spec
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        spec.with_kv_heads(5)


def test_get_spec():
    assert get_spec("Llama-3-8B") is CATALOG["llama-3-8b"]
    assert get_spec(CATALOG["gpt2"]) is CATALOG["gpt2"]
    with pytest.raises(ValueError, match="smollm2-135m"):  # lists the valid choices
        get_spec("llama-9")


@pytest.mark.parametrize(
    "change",
    [
        {"n_layers": 0},
        {"d_model": -1},
        {"n_heads": 2.5},
        {"n_kv_heads": 0},
        {"head_dim": True},
        {"n_kv_heads": 4},  # 9 query heads cannot be split into 4 groups
        {"arch": "mamba"},
        {"n_active_experts": 2},
    ],
)
def test_invalid_specs_raise(change):
    with pytest.raises(ValueError):
        dataclasses.replace(CATALOG["smollm2-135m"], **change)


SMOLLM2_135M_CONFIG = {
    "model_type": "llama",
    "_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
    "rope_theta": 100000,
    "rms_norm_eps": 1e-5,
}


def test_from_hf_config_dict_and_path(tmp_path):
    expected = dataclasses.replace(
        CATALOG["smollm2-135m"], name="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert ModelSpec.from_hf_config(SMOLLM2_135M_CONFIG) == expected
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_135M_CONFIG))
    assert ModelSpec.from_hf_config(tmp_path) == expected
    assert ModelSpec.from_hf_config(str(tmp_path / "config.json"), name="x").n_params == 134_515_008


def test_from_hf_config_rejects_unknown_type_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="gpt2"):
        ModelSpec.from_hf_config({"model_type": "bert"})
    with pytest.raises(ValueError, match="config.json"):
        ModelSpec.from_hf_config(tmp_path)


def test_from_transformers_configs_match_catalog():
    transformers = pytest.importorskip("transformers")
    mixtral = CATALOG["mixtral-8x7b"]
    configs = {
        "gpt2": transformers.GPT2Config(),  # its defaults are GPT-2 small
        "mistral-7b": transformers.MistralConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=32768,
        ),
        "qwen2.5-0.5b": transformers.Qwen2Config(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
        ),
        "mixtral-8x7b": transformers.MixtralConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=32768,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    }
    for name, config in configs.items():
        spec = ModelSpec.from_hf_config(config)
        assert (spec.n_params, spec.n_params_active) == (
            CATALOG[name].n_params,
            CATALOG[name].n_params_active,
        ), name
    assert (
        ModelSpec.from_hf_config(configs["mixtral-8x7b"]).n_active_experts
        == mixtral.n_active_experts
    )


def test_counts_match_a_transformers_model_built_on_the_meta_device():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        **{k: v for k, v in SMOLLM2_135M_CONFIG.items() if k != "_name_or_path"}
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == ModelSpec.from_hf_config(config).n_params
