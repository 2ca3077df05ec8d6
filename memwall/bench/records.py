"""Benchmark records: JSON results kept under benchmarks/results, each with the machine it came from.

A chapter that shows a recorded figure next to a live one must say whether the two come from the
same kind of machine: a record from an AVX2 EPYC printed under the same "AMD EPYC" label as a live
figure from an AVX-512 EPYC three times faster reads as a contradiction. `recorded(name)` loads a
record and compares its fingerprint with this machine's (`memwall.fingerprint.same_machine`);
`save_record` writes one with the fingerprint in it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memwall.fingerprint import describe, machine_fingerprint, same_machine

# Where the records live in a checkout of the repository (not in an installed wheel).
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@dataclass(frozen=True)
class Recorded:
    """A benchmark record, and whether it was made on a machine like this one."""

    name: str
    data: dict
    same_machine: bool
    note: str  # one sentence a chapter can print next to the figure

    def __getitem__(self, key):
        return self.data[key]


def _resolve(name: str, results_dir: Path | str | None) -> Path:
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    path = folder / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        available = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
        raise FileNotFoundError(
            f"No benchmark record {name!r} in {folder}"
            + (f"; choose from {', '.join(available)}." if available else " (no records there).")
        )
    return path


def recorded(
    name: str, results_dir: Path | str | None = None, here: dict | None = None
) -> Recorded:
    """Load benchmarks/results/<name>.json and say whether it was recorded on this kind of machine.

    here: the fingerprint to compare with (default: this machine's).
    """
    data = json.loads(_resolve(name, results_dir).read_text())
    theirs, here = data.get("machine"), machine_fingerprint() if here is None else here
    if not theirs:
        return Recorded(name, data, False, "recorded on a machine it did not fingerprint.")
    if same_machine(theirs, here):
        return Recorded(
            name, data, True, f"recorded on a machine like this one ({describe(theirs)})."
        )
    note = f"recorded on a different machine ({describe(theirs)}); this one is {describe(here)}."
    return Recorded(name, data, False, note)


def save_record(result: dict, name: str, results_dir: Path | str | None = None) -> Path:
    """Write `result` as <name>.json, adding this machine's fingerprint if it has none."""
    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    record = result if result.get("machine") else {**result, "machine": machine_fingerprint()}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
