"""Benchmark records carry the machine they came from, and say so when shown elsewhere."""

import json

import pytest

from memwall.bench import recorded, save_record
from memwall.bench.records import RESULTS_DIR
from memwall.fingerprint import IDENTITY_KEYS, machine_fingerprint


def test_every_committed_record_carries_a_fingerprint():
    paths = sorted(RESULTS_DIR.glob("*.json"))
    assert paths, f"no records in {RESULTS_DIR}"
    for path in paths:
        machine = json.loads(path.read_text()).get("machine")
        assert machine and all(key in machine for key in IDENTITY_KEYS), path.name


def test_a_record_from_this_machine_says_so(tmp_path):
    save_record({"tok_per_s": 50.0}, "mine", tmp_path)
    record = recorded("mine", tmp_path)
    assert record.same_machine and record["tok_per_s"] == 50.0
    assert record.note.startswith("recorded on a machine like this one")


def test_a_record_from_another_machine_says_so(tmp_path):
    other = {**machine_fingerprint(), "cpu_model": "Some Other CPU", "isa": ["avx2"]}
    save_record({"tok_per_s": 17.0, "machine": other}, "theirs", tmp_path)
    record = recorded("theirs.json", tmp_path)
    assert not record.same_machine
    assert record.note.startswith("recorded on a different machine (Some Other CPU")
    # Compared with the machine that made it, it is the same one.
    assert recorded("theirs", tmp_path, here=other).same_machine


def test_an_unfingerprinted_record_is_not_claimed_as_this_machine(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"tok_per_s": 1.0}))
    record = recorded("old", tmp_path)
    assert not record.same_machine and "did not fingerprint" in record.note


def test_a_missing_record_names_the_available_ones(tmp_path):
    save_record({}, "present", tmp_path)
    with pytest.raises(FileNotFoundError, match="choose from present"):
        recorded("absent", tmp_path)
