"""One device per notebook: the model, the engine and measure() agree; a GPU is the default where
there is one, and MEMWALL_DEVICE=cpu keeps a GPU machine's notebook on the CPU."""

import dataclasses

import pytest
import torch

from memwall import models
from memwall.engine import Transformer, shared_engine
from memwall.machine import devices, microbench
from memwall.specs import get_spec

TINY = dataclasses.replace(get_spec("smollm2-135m"), n_layers=2)


@pytest.fixture
def cuda_present(monkeypatch):
    """torch says a CUDA GPU is there (nothing may actually be allocated on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(devices.ENVIRONMENT_VARIABLE, raising=False)


def test_with_a_gpu_present_the_notebook_runs_on_it_and_says_how_to_choose_the_cpu(cuda_present):
    assert devices.default_device() == "cuda"
    assert devices.describe() == (
        "Runs on cuda and measures cuda (the GPU found).\n"
        "To run on the CPU instead, set MEMWALL_DEVICE=cpu before starting."
    )


def test_the_variable_keeps_a_gpu_machine_on_the_cpu(cuda_present, monkeypatch):
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, "cpu")
    assert devices.default_device() == "cpu"
    assert "has a GPU too" in devices.describe() and "MEMWALL_DEVICE=cuda" in devices.describe()
    assert max(len(line) for line in devices.describe().splitlines()) <= 92
    hf_model = models.random_init(TINY)
    engine = Transformer.from_hf(hf_model)
    measured = microbench.measure(quick=True)
    assert {next(hf_model.parameters()).device.type, next(engine.parameters()).device.type} == {
        "cpu"
    }
    assert measured.device_type == "cpu"


def test_the_variable_moves_everything_to_the_named_device(cuda_present, monkeypatch):
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, "cuda")
    assert devices.default_device() == "cuda"
    assert devices.describe() == "Runs on cuda and measures cuda (MEMWALL_DEVICE=cuda)."
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, "cpu")
    assert devices.default_device() == "cpu"


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "tpu"])
def test_a_bad_device_name_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, value)
    with pytest.raises(ValueError, match="use cpu, cuda, cuda:N or mps"):
        devices.default_device()


def test_asking_for_a_gpu_that_is_not_there_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, "cuda")
    with pytest.raises(ValueError, match="sees no cuda device"):
        devices.default_device()


def test_without_a_gpu_the_sentence_says_so(monkeypatch):
    monkeypatch.setattr(devices, "gpu_present", lambda: False)
    monkeypatch.delenv(devices.ENVIRONMENT_VARIABLE, raising=False)
    assert devices.describe() == "Runs on the CPU and measures the CPU (no GPU found)."


@pytest.mark.slow
def test_the_offline_model_loads_where_measure_measures(cuda_present, monkeypatch):
    monkeypatch.setenv(devices.ENVIRONMENT_VARIABLE, "cpu")
    hf_model, _ = models.load("smollm2-135m")
    engine = shared_engine(hf_model)
    assert next(hf_model.parameters()).device.type == "cpu"
    assert next(engine.parameters()).device.type == "cpu"
    assert microbench.measure(quick=True).device_type == "cpu"
