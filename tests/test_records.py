"""Benchmark records carry the machine they came from, are named by it, and say so when shown."""

import json

import pytest

from memwall.bench import recorded, save_record
from memwall.bench.records import RESULTS_DIR, date_of, name_date, parse_record_name
from memwall.machine.fingerprint import IDENTITY_KEYS, fingerprint_id, machine_fingerprint


def test_every_committed_record_carries_a_fingerprint():
    paths = sorted(RESULTS_DIR.glob("*.json"))
    assert paths, f"no records in {RESULTS_DIR}"
    for path in paths:
        machine = json.loads(path.read_text()).get("machine")
        assert machine and all(key in machine for key in IDENTITY_KEYS), path.name


def test_every_committed_record_is_named_by_benchmark_machine_and_date():
    for path in sorted(RESULTS_DIR.glob("*.json")):
        parsed = parse_record_name(path.name)
        assert parsed, f"{path.name}: not <benchmark>-<machine id>-<YYYY-MM-DDTHHMM>.json"
        record = json.loads(path.read_text())
        assert record.get("machine_id") == parsed.machine_id, path.name
        if date_of(record):
            assert name_date(date_of(record)) == parsed.date, path.name


def test_a_saved_record_is_named_by_benchmark_machine_and_date(tmp_path):
    path = save_record({"tok_per_s": 50.0, "date": "2026-12-04 00:42 UTC"}, "batch_fast", tmp_path)
    assert path.name == f"batch_fast-{fingerprint_id()}-2026-12-04T0042.json"
    record = json.loads(path.read_text())
    assert record["machine_id"] == fingerprint_id(record["machine"])
    # Without a date of its own, the record gets today's, in the field and in its name.
    undated = save_record({"tok_per_s": 50.0}, "batch_fast", tmp_path)
    assert parse_record_name(undated.name).date == name_date(
        date_of(json.loads(undated.read_text()))
    )
    # ISO dates (llamacpp_compare's "when") name the file the same way.
    assert name_date("2026-12-02T07:55:07Z") == "2026-12-02T0755"


def test_a_benchmark_name_with_a_separator_is_refused(tmp_path):
    with pytest.raises(ValueError, match="lower-case letters"):
        save_record({}, "batch-fast", tmp_path)
    with pytest.raises(ValueError, match="lower-case letters"):
        save_record({}, "Batch", tmp_path)


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


def test_a_benchmark_loads_this_machines_latest_record_else_anyones(tmp_path):
    other = {**machine_fingerprint(), "cpu_model": "Some Other CPU", "isa": ["avx2"]}
    save_record({"tok_per_s": 1.0, "date": "2026-12-01 10:00 UTC"}, "decode", tmp_path)
    save_record({"tok_per_s": 2.0, "date": "2026-12-02 10:00 UTC"}, "decode", tmp_path)
    newest = save_record(
        {"tok_per_s": 3.0, "date": "2026-12-03 10:00 UTC", "machine": other}, "decode", tmp_path
    )
    assert recorded("decode", tmp_path)["tok_per_s"] == 2.0
    assert recorded("decode", tmp_path, here=other)["tok_per_s"] == 3.0
    stranger = {**other, "cpu_model": "A Third CPU"}
    assert recorded("decode", tmp_path, here=stranger)["tok_per_s"] == 3.0
    # A file name loads that file.
    assert recorded(newest.stem, tmp_path)["tok_per_s"] == 3.0


def test_an_unfingerprinted_record_is_not_claimed_as_this_machine(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"tok_per_s": 1.0}))
    record = recorded("old", tmp_path)
    assert not record.same_machine and "did not fingerprint" in record.note


def test_a_missing_record_names_the_available_ones(tmp_path):
    save_record({}, "present", tmp_path)
    with pytest.raises(FileNotFoundError, match="choose from present"):
        recorded("absent", tmp_path)
