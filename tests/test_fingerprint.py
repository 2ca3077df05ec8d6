import json

from memwall.machine import fingerprint
from memwall.machine.fingerprint import (
    fingerprint_id,
    has_native_bf16,
    machine_fingerprint,
    same_machine,
)


def test_fingerprint_has_every_key_and_is_json():
    fp = machine_fingerprint()
    assert set(fp) == {
        "cpu_model",
        "isa",
        "cores",
        "threads",
        "usable_cores",
        "l3_bytes",
        "memory_bytes",
        "gpu",
        "torch_version",
        "platform",
    }
    assert json.loads(json.dumps(fp)) == fp
    assert fp["cores"] >= 1 and fp["threads"] >= 1 and fp["usable_cores"] >= 1
    assert fp["isa"] == sorted(fp["isa"])
    assert set(fp["isa"]) <= set(fingerprint.RELEVANT_FLAGS)


def test_fingerprint_id_is_stable_and_ignores_threads():
    fp = machine_fingerprint()
    assert fingerprint_id(fp) == fingerprint_id(dict(fp)) == fingerprint_id()
    assert len(fingerprint_id(fp)) == 12
    assert fingerprint_id({**fp, "threads": fp["threads"] + 7}) == fingerprint_id(fp)
    assert fingerprint_id({**fp, "usable_cores": 1}) == fingerprint_id(fp)  # a setting
    assert fingerprint_id({**fp, "cpu_model": "Other CPU"}) != fingerprint_id(fp)


def test_same_machine_compares_identity_keys():
    fp = machine_fingerprint()
    assert same_machine(fp, {**fp, "threads": 99, "torch_version": "0.0"})
    assert same_machine(fp, {**fp, "isa": list(reversed(fp["isa"]))})
    assert not same_machine(fp, {**fp, "cpu_model": "Apple M2"})
    assert not same_machine(fp, {**fp, "cores": fp["cores"] + 1})
    assert not same_machine(fp, {**fp, "gpu": "NVIDIA H100"})
    assert not same_machine(fp, None)


def test_bf16_capability_from_flags():
    assert has_native_bf16({"isa": ["avx2", "avx512_bf16"]})
    assert has_native_bf16({"isa": ["amx_bf16", "amx_tile"]})
    assert has_native_bf16({"isa": ["asimd", "bf16"]})
    assert not has_native_bf16({"isa": ["avx2", "fma"]})


def test_cpuinfo_parsing(monkeypatch, tmp_path):
    monkeypatch.setattr(
        fingerprint,
        "_cpuinfo",
        lambda: [
            {
                "model name": "Test CPU",
                "flags": "fpu avx2 fma avx512f",
                "physical id": "0",
                "core id": "0",
            },
            {
                "model name": "Test CPU",
                "flags": "fpu avx2 fma avx512f",
                "physical id": "0",
                "core id": "1",
            },
            {
                "model name": "Test CPU",
                "flags": "fpu avx2 fma avx512f",
                "physical id": "0",
                "core id": "1",
            },
        ],
    )
    assert fingerprint.cpu_model() == "Test CPU"
    assert fingerprint.isa_flags() == ["avx2", "avx512f", "fma"]
    assert fingerprint.physical_cores() == 2  # two hyperthreads on core 1 count once
