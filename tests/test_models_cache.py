"""The converted offline model is cached per transformers major version, so a downgrade never
loads a tokenizer that a newer transformers saved (5.x writes a class 4.x cannot import)."""

import json

import pytest
import transformers

from memwall import models
from memwall.machine import memory

MAJOR = transformers.__version__.split(".")[0]


def fake_conversion(folder, version):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "config.json").write_text(json.dumps({"transformers_version": version}))


def no_gguf():
    raise AssertionError("converted again although a usable copy was cached")


def test_a_copy_from_this_major_version_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMWALL_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "gguf_path", no_gguf)
    fake_conversion(tmp_path / "smollm2-135m", f"{MAJOR}.0.1")  # memwall 0.1's unversioned folder
    assert models._converted_offline_model() == tmp_path / "smollm2-135m"
    fake_conversion(tmp_path / f"smollm2-135m-transformers{MAJOR}", f"{MAJOR}.9.0")
    assert models._converted_offline_model() == tmp_path / f"smollm2-135m-transformers{MAJOR}"


def test_a_copy_from_another_major_version_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMWALL_CACHE", str(tmp_path))
    fake_conversion(tmp_path / "smollm2-135m", f"{int(MAJOR) + 1}.0.0")

    def conversion_starts():
        raise ValueError("converting")

    monkeypatch.setattr(models, "gguf_path", conversion_starts)
    with pytest.raises(ValueError, match="converting"):
        models._converted_offline_model()


def test_a_local_folder_is_loaded_not_sent_to_the_hub(tmp_path, monkeypatch):
    class Loaded:  # what from_pretrained returns here: a stand-in that records its folder
        def __init__(self, folder, **_):
            self.folder = folder

        def to(self, device):
            return self

        def eval(self):
            return self

    def offline(name):
        raise AssertionError(f"{name} was treated as a hub id")

    monkeypatch.setattr(models, "_require_network", offline)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", Loaded)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", Loaded)
    with pytest.raises(ValueError, match="without a model's config.json"):
        models.load(str(tmp_path))
    fake_conversion(tmp_path / "saved", "5.0.0")
    model, tokenizer = models.load(str(tmp_path / "saved"), device="cpu")
    assert model.folder == tokenizer.folder == str(tmp_path / "saved")
    # weights larger than the memory left: a clear error before loading, not a killed kernel
    (tmp_path / "saved" / "model.safetensors").write_bytes(b"\0" * 3000)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 2000)
    with pytest.raises(ValueError, match="weights needs .* GB and .* GB is free here; close"):
        models.load(str(tmp_path / "saved"), device="cpu")
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 0)  # unknown: no check
    assert models.load(str(tmp_path / "saved"), device="cpu")[0].folder
