"""The measured exercises' checks are decided by the method, not by luck.

Each check draws pretend machines at random, so one run proves little. Over many hidden-case
seeds, the solution in solutions/ must pass every time and every listed naive method must fail
every time (the fast sync test tries one seed per run).
"""

import contextlib
import io
import re
from pathlib import Path

import pytest

from memwall.grading import check, get_check

SOLUTIONS = Path(__file__).resolve().parents[1] / "solutions"
MEASURED = {
    "ch03.cache_cliff": ("03_memory_wall", "cache_cliff"),
    "ch04.kv_cost": ("04_kv_cache", "kv_cost"),
    "ch06.batch_speedups": ("06_batching", "batch_speedups"),
    "ch07.format_speedups": ("07_quantization", "format_speedups"),
    "ch08.verify_cost_per_token": ("08_speculative", "verify_cost_per_token"),
    "ch09.ab_slowdown": ("09_measuring", "ab_slowdown"),
    "ch09.warmup_steps": ("09_measuring", "warmup_steps"),
}
SEEDS = range(40)


def test_every_measured_check_is_listed_here():
    """A measured check left out of MEASURED would skip the 40-seed tests below unnoticed."""
    registered = set()
    for key in (SOLUTIONS / "checks").glob("ch*.py"):
        for call in re.findall(r"@register_cases\((.*?)\)\ndef ", key.read_text(), re.S):
            if re.search(r"measured\s*=\s*True", call):
                registered.add(re.match(r'\s*"([^"]+)"', call).group(1))
    assert registered == set(MEASURED)


def solution_function(notebook, name):
    """The function ``name`` as the solution notebook defines it (its exercise cell, run)."""
    source = (SOLUTIONS / f"{notebook}.md").read_text()
    for cell in re.findall(r"```\{code-cell\}\n(.*?)```", source, re.S):
        if f"def {name}(" in cell and "BEGIN SOLUTION" in cell:
            namespace = {}
            exec(re.sub(r"^---\n.*?\n---\n", "", cell, flags=re.S), namespace)
            return namespace[name]
    raise LookupError(f"no exercise cell defines {name} in {notebook}.md")


def passes(name, answer, seed, monkeypatch) -> bool:
    monkeypatch.setenv("MEMWALL_CHECK_SEED", str(seed))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            check(name, answer)
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("name", MEASURED)
def test_the_solution_passes_on_every_seed(name, monkeypatch):
    solution = solution_function(*MEASURED[name])
    failed = [seed for seed in SEEDS if not passes(name, solution, seed, monkeypatch)]
    assert failed == []


@pytest.mark.parametrize("name", MEASURED)
def test_every_naive_method_fails_on_every_seed(name, monkeypatch):
    for wrong in get_check(name).wrong_answers:
        passed = [seed for seed in SEEDS if passes(name, wrong, seed, monkeypatch)]
        assert passed == [], f"{wrong.__name__} passed {name} for seeds {passed}"
