"""Benchmark records: JSON results under benchmarks/results, each named by the machine it came from.

A figure recorded on one machine and shown on another must say so: two CPUs with the same model
name can differ in vector width, cache size or memory bandwidth, so a recorded tok/s compares
only with one from the same kind of machine. Every record therefore carries the machine's
fingerprint (`machine`) and its short id (`machine_id`, from `fingerprint_id` in
`memwall.machine.fingerprint`), and its file name says what was measured, where and when:

    <benchmark>-<machine id>-<date>.json      e.g. batch_fast-28ba0b498450-2026-12-04T0042.json

- benchmark: lower-case letters, digits and underscores: the script or `memwall bench`
  subcommand, plus a variant where one benchmark records several kinds of run (`decode_int8`);
- machine id: the 12 hex digits of the record's fingerprint;
- date: when the record was made, UTC, `YYYY-MM-DDTHHMM`.

So the records of one machine sort by date, and no name depends on the order of runs.
`save_record(result, benchmark)` writes a record under that name; `recorded(name)` loads one, by
file name or by benchmark (the latest from a machine like this one, else the latest from any),
and says whether it was recorded on a machine like this one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from memwall.machine.fingerprint import describe, fingerprint_id, machine_fingerprint, same_machine

# Where the records live in a checkout of the repository (not in an installed wheel).
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"

BENCHMARK_PATTERN = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
NAME_PATTERN = re.compile(
    r"(?P<benchmark>[a-z0-9]+(?:_[a-z0-9]+)*)-(?P<machine_id>[0-9a-f]{12})"
    r"-(?P<date>\d{4}-\d{2}-\d{2}T\d{4})\.json"
)
# The fields that may hold when a record was made, and the format `save_record` writes.
DATE_FIELDS = ("date", "when")
DATE_FIELD_FORMAT = "%Y-%m-%d %H:%M UTC"


class RecordName(NamedTuple):
    benchmark: str
    machine_id: str
    date: str  # YYYY-MM-DDTHHMM, UTC


@dataclass(frozen=True)
class Recorded:
    """A benchmark record, and whether it was made on a machine like this one."""

    name: str
    data: dict
    same_machine: bool
    note: str  # one sentence a chapter can print next to the figure

    def __getitem__(self, key):
        return self.data[key]


def parse_record_name(filename: str) -> RecordName | None:
    """The parts of a record's file name, or None where it does not follow the naming rule."""
    match = NAME_PATTERN.fullmatch(Path(filename).name)
    return RecordName(**match.groupdict()) if match else None


def date_of(record: dict) -> str | None:
    """The record's own date field, as written (None where it has none)."""
    return next((record[key] for key in DATE_FIELDS if record.get(key)), None)


def name_date(date: str | None = None) -> str:
    """A record's date as its file name writes it (YYYY-MM-DDTHHMM); None means now.

    Accepts the "2026-12-04 00:42 UTC" that `memwall bench` records and ISO 8601 ("...Z").
    """
    if date is None:
        when = datetime.now(timezone.utc)
    else:
        text = date.strip().removesuffix(" UTC").replace("Z", "+00:00")
        when = datetime.fromisoformat(text)
        if when.tzinfo is not None:
            when = when.astimezone(timezone.utc)
    return when.strftime("%Y-%m-%dT%H%M")


def record_name(benchmark: str, record: dict) -> str:
    """The file name a fingerprinted record gets: <benchmark>-<machine id>-<date>.json."""
    if not BENCHMARK_PATTERN.fullmatch(benchmark):
        raise ValueError(
            f"benchmark name {benchmark!r}: use lower-case letters, digits and single "
            "underscores (e.g. 'batch_fast', 'decode_int8'); '-' separates the name's parts."
        )
    machine_id = record.get("machine_id") or fingerprint_id(record["machine"])
    return f"{benchmark}-{machine_id}-{name_date(date_of(record))}.json"


def save_record(result: dict, benchmark: str, results_dir: Path | str | None = None) -> Path:
    """Write `result` as <benchmark>-<machine id>-<date>.json and return its path.

    It adds this machine's fingerprint when the result has none, the fingerprint's id, and the
    date (now, UTC) when the result has no "date" or "when" of its own.
    """
    record = dict(result)
    if not record.get("machine"):
        record["machine"] = machine_fingerprint()
    record.setdefault("machine_id", fingerprint_id(record["machine"]))
    if date_of(record) is None:
        record["date"] = datetime.now(timezone.utc).strftime(DATE_FIELD_FORMAT)
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / record_name(benchmark, record)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def _resolve(name: str, folder: Path, here: dict) -> Path:
    """A record's path from its file name (with or without .json) or from its benchmark."""
    stem = name.removesuffix(".json")
    path = folder / f"{stem}.json"
    if path.is_file():
        return path
    named = [
        (parsed, p)
        for p in (folder.glob(f"{stem}-*.json") if folder.is_dir() else [])
        if (parsed := parse_record_name(p.name)) and parsed.benchmark == stem
    ]
    if named:
        latest_first = [p for _, p in sorted(named, key=lambda item: item[0].date, reverse=True)]
        for candidate in latest_first:
            if same_machine(json.loads(candidate.read_text()).get("machine"), here):
                return candidate
        return latest_first[0]
    found = sorted(folder.glob("*.json")) if folder.is_dir() else []
    available = sorted({getattr(parse_record_name(p.name), "benchmark", p.stem) for p in found})
    raise FileNotFoundError(
        f"No benchmark record {name!r} in {folder}"
        + (f"; choose from {', '.join(available)}." if available else " (no records there).")
    )


def recorded(
    name: str, results_dir: Path | str | None = None, here: dict | None = None
) -> Recorded:
    """Load a record and say whether it was recorded on this kind of machine.

    name: a file name in the results folder (with or without .json), or a benchmark, for its
    latest record from a machine like `here`, else its latest from any machine.
    here: the fingerprint to compare with (default: this machine's).
    """
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    here = machine_fingerprint() if here is None else here
    path = _resolve(name, folder, here)
    data = json.loads(path.read_text())
    theirs = data.get("machine")
    if not theirs:
        return Recorded(path.stem, data, False, "recorded on a machine it did not fingerprint.")
    if same_machine(theirs, here):
        note = f"recorded on a machine like this one ({describe(theirs)})."
        return Recorded(path.stem, data, True, note)
    note = f"recorded on a different machine ({describe(theirs)}); this one is {describe(here)}."
    return Recorded(path.stem, data, False, note)
