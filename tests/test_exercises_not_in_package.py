"""Exercises that a public memwall function used to answer must stay unanswered by it.

memwall ships with every student's install, and the chapters use its cost model: a student who
finds `ModelSpec.n_params`, `cost.memory_budget` or `cost.expected_experts_touched` could call it
instead of working the exercise out. So these exercises ask for a variant the package does not
compute (a plain MLP, whole cache blocks, a router with favourites). For each, the most direct
call of the package with the exercise's arguments must fail the check, on the hidden cases of
many draws and on the practice cases the student's copy replays. Each call is first shown to be
the right one: on the special case the package does cover, it equals the reference, so these
tests fail if the exercise ever becomes the package's question again.
"""

import math
import random

import pytest

from memwall import cost
from memwall.grading import get_check
from memwall.grading.expected import load_expected, replay
from memwall.hardware import Hardware
from memwall.specs import ModelSpec

SEEDS = range(200)


def llama_params_by_memwall(n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size,
                            tied, gated):  # fmt: skip
    shape = ModelSpec("exercise", n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff,
                      vocab_size, tied, max_context=1)  # fmt: skip
    return shape.n_params


def max_users_by_memwall(memory_bytes, weight_bytes, kv_bytes_per_token, context, block_tokens):
    # memory_budget takes a model and a GPU: one layer with one KV head of the width that makes
    # kv_bytes_per_token in bf16, on a GPU that leaves the case's memory free beside its weights.
    model = ModelSpec("exercise", 1, 1, 1, 1, kv_bytes_per_token // 4, 1, 1, True, 1 << 20)
    assert cost.kv_bytes_per_token(model) == kv_bytes_per_token
    weights = cost.weight_storage_bytes(model)
    free = memory_bytes - weight_bytes
    gpu = Hardware("exercise", 1e12, {"bf16": 1e12}, weights + free if free > 0 else weights / 2)
    return cost.memory_budget(model, gpu, context)


def moe_weight_bytes_by_memwall(batch, pick_probs, expert_bytes, shared_bytes):
    model = ModelSpec("exercise", 1, 1, 1, 1, 1, 1, 1, True, 1, n_experts=len(pick_probs),
                      n_active_experts=round(sum(pick_probs)))  # fmt: skip
    return shared_bytes + cost.expected_experts_touched(model, batch) * expert_bytes


def gated(case):
    return {**case, "gated": True}


def one_token_blocks(case):
    return {**case, "block_tokens": 1}


def even_router(case):
    n_experts, active = len(case["pick_probs"]), round(sum(case["pick_probs"]))
    return {**case, "pick_probs": [active / n_experts] * n_experts}


# (check, the package's answer, what turns a case into one the package does answer)
EXERCISES = [
    ("ch03.llama_params", llama_params_by_memwall, gated),
    ("ch05.max_users", max_users_by_memwall, one_token_blocks),
    ("ch09.moe_weight_bytes", moe_weight_bytes_by_memwall, even_router),
]
IDS = [name for name, _, _ in EXERCISES]


@pytest.mark.parametrize("name, by_memwall, covered", EXERCISES, ids=IDS)
def test_the_package_call_is_the_right_call_where_the_package_covers_the_case(
    name, by_memwall, covered
):
    spec = get_check(name)
    for seed in range(20):
        for case in spec.cases(random.Random(f"{name}:{seed}")):
            case = covered(case)
            assert math.isclose(by_memwall(**case), spec.reference(**case), rel_tol=1e-9), case


@pytest.mark.parametrize("name, by_memwall, covered", EXERCISES, ids=IDS)
def test_the_check_rejects_the_package_call_on_every_draw(name, by_memwall, covered):
    spec = get_check(name)
    accepted = []
    for seed in SEEDS:
        try:
            spec.function(by_memwall, random.Random(f"{name}:{seed}"))
        except AssertionError:
            continue
        accepted.append(seed)
    assert accepted == [], f"{name}: memwall's own function passes the hidden cases"


@pytest.mark.parametrize("name, by_memwall, covered", EXERCISES, ids=IDS)
def test_the_practice_cases_reject_the_package_call(name, by_memwall, covered):
    assert load_expected(name), f"{name} has no practice cases: run `memwall notebooks`"
    with pytest.raises(AssertionError):
        replay(name, by_memwall)
