"""Checks for chapter 6 (batching).

1. ``ch06.compute_bound_batch``: the smallest batch at which a decode step reaches the ridge point,
   from the ledger (weights read once per step, KV cache read per sequence); infinite when the KV
   cache keeps the intensity below the ridge at every batch size (Pope et al. 2022).
2. ``ch06.predicted_throughput``: total tokens/s of a batched decode step from the roofline.
3. ``ch06.block_tables``: a paged-KV-cache block allocator with a free list (Kwon et al. 2023).
4. ``ch06.paged_waste``: the fraction of allocated KV slots that hold no token, for a block size.
"""

import math

from memwall.fakeclock import bench_spec
from memwall.grading.measured_compare import drifting, noisy_machine
from memwall.grading.registry import register_cases
from memwall.widgets.practice import blocks_in_use, random_events  # noqa: F401

# A sound interleaved method lands within ~2% of the true speed-ups; drift moves a naive one 10%+.
SPEEDUP_RTOL = 0.06

CASES_PER_CHECK = 12


# ---- 1. the batch at which decode becomes compute-bound -------------------------------------------


def decode_intensity(batch, context, n_params, bytes_per_param, kv_bytes_per_token):
    """FLOPs per byte of a decode step: 2 FLOPs per parameter per sequence, over the weights (read
    once) plus every sequence's KV cache."""
    return (
        2 * batch * n_params / (n_params * bytes_per_param + batch * context * kv_bytes_per_token)
    )


def reference_compute_bound_batch(
    ridge_point, context, n_params, bytes_per_param, kv_bytes_per_token
):
    # 2 B N >= r (N b + B c kv)  <=>  B (2 N - r c kv) >= r N b. As B grows the intensity rises
    # towards 2 N / (c kv); if that limit is below the ridge no batch is large enough.
    headroom = 2 * n_params - ridge_point * context * kv_bytes_per_token
    if headroom <= 0:
        return math.inf
    batch = max(1, math.ceil(ridge_point * n_params * bytes_per_param / headroom))
    # guard the ceil against rounding: the answer is the first integer that really reaches the ridge
    while (
        batch > 1
        and decode_intensity(batch - 1, context, n_params, bytes_per_param, kv_bytes_per_token)
        >= ridge_point
    ):
        batch -= 1
    while (
        decode_intensity(batch, context, n_params, bytes_per_param, kv_bytes_per_token)
        < ridge_point
    ):
        batch += 1
    return batch


def _weights_only_batch(ridge_point, context, n_params, bytes_per_param, kv_bytes_per_token):
    return max(1, math.ceil(ridge_point * bytes_per_param / 2))  # forgets the KV cache


def _no_factor_two(ridge_point, context, n_params, bytes_per_param, kv_bytes_per_token):
    return reference_compute_bound_batch(
        ridge_point / 2, context, n_params, bytes_per_param, kv_bytes_per_token
    )


@register_cases(
    "ch06.compute_bound_batch",
    reference=reference_compute_bound_batch,
    wrong_answers=[_weights_only_batch, _no_factor_two],
)
def cases_compute_bound_batch(rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        n_params = rng.choice([135e6, 1.24e9, 8.03e9, 70.6e9])
        bytes_per_param = rng.choice([0.5, 1, 2, 4])
        kv = rng.choice([4096, 46080, 131072, 327680])
        ridge = rng.choice([2.5, 5.0, 153.0, 295.2, 591.0])
        # a quarter of the cases at a context long enough that no batch gets there
        limit = 2 * n_params / (ridge * kv)
        context = (
            int(limit * rng.uniform(1.05, 3))
            if number % 4 == 0
            else max(1, int(limit * rng.uniform(0.01, 0.9)))
        )
        cases.append(
            dict(
                ridge_point=ridge,
                context=context,
                n_params=n_params,
                bytes_per_param=bytes_per_param,
                kv_bytes_per_token=kv,
            )
        )
    return cases


# ---- 2. throughput predicted from the ledger ------------------------------------------------------


def reference_predicted_throughput(
    batch, context, weight_bytes, kv_bytes_per_token, flops_per_token, bandwidth, peak_flops
):
    # one step: the weights once, each sequence's cache, and every sequence's FLOPs
    memory_s = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth
    compute_s = batch * flops_per_token / peak_flops
    return batch / max(memory_s, compute_s)


@register_cases(
    "ch06.predicted_throughput",
    reference=reference_predicted_throughput,
    wrong_answers=[
        lambda batch, context, weight_bytes, kv_bytes_per_token, flops_per_token, bandwidth, peak_flops: (
            batch * bandwidth / (weight_bytes + batch * context * kv_bytes_per_token)
        ),
        lambda batch, context, weight_bytes, kv_bytes_per_token, flops_per_token, bandwidth, peak_flops: (
            batch
            / max(
                batch * (weight_bytes + context * kv_bytes_per_token) / bandwidth,
                batch * flops_per_token / peak_flops,
            )
        ),
    ],
)
def cases_predicted_throughput(rng):
    cases = [
        dict(
            batch=256,
            context=64,
            weight_bytes=538e6,
            kv_bytes_per_token=46080,
            flops_per_token=270e6,
            bandwidth=20e9,
            peak_flops=60e9,
        ),
        dict(
            batch=8,
            context=1024,
            weight_bytes=16e9,
            kv_bytes_per_token=131072,
            flops_per_token=16e9,
            bandwidth=3.35e12,
            peak_flops=989e12,
        ),
    ]
    for _ in range(CASES_PER_CHECK):
        n_params = rng.choice([135e6, 1.24e9, 8.03e9])
        cases.append(
            dict(
                batch=rng.choice([1, 2, 8, 32, 128, 512, 2048]),
                context=rng.choice([1, 128, 2048, 32768]),
                weight_bytes=n_params * rng.choice([0.5, 2, 4]),
                kv_bytes_per_token=rng.choice([46080, 131072, 32768]),
                flops_per_token=2 * n_params,
                bandwidth=rng.choice([20e9, 100e9, 3.35e12]),
                peak_flops=rng.choice([60e9, 989e12, 312e12]),
            )
        )
    return cases


# ---- 3. a block-table allocator -------------------------------------------------------------------


def reference_block_tables(events, n_blocks, block_size):
    """events: ("append", seq, tokens) grows seq by `tokens` tokens; ("free", seq) ends it.
    Every new block is the lowest-numbered free one. Returns {seq: [block ids]} of live sequences."""
    free = set(range(n_blocks))
    tables, lengths = {}, {}
    for event in events:
        if event[0] == "append":
            _, seq, tokens = event
            tables.setdefault(seq, [])
            lengths[seq] = lengths.get(seq, 0) + tokens
            while len(tables[seq]) * block_size < lengths[seq]:
                block = min(free)
                free.remove(block)
                tables[seq].append(block)
        else:
            free.update(tables.pop(event[1]))
            del lengths[event[1]]
    return tables


def _never_reuses(events, n_blocks, block_size):
    tables, lengths, next_block = {}, {}, 0
    for event in events:
        if event[0] == "append":
            _, seq, tokens = event
            tables.setdefault(seq, [])
            lengths[seq] = lengths.get(seq, 0) + tokens
            while len(tables[seq]) * block_size < lengths[seq]:
                tables[seq].append(next_block)
                next_block += 1
        else:
            tables.pop(event[1]), lengths.pop(event[1])
    return tables


def _new_blocks_every_append(events, n_blocks, block_size):
    free, tables = set(range(n_blocks)), {}
    for event in events:
        if event[0] == "append":
            _, seq, tokens = event
            for _ in range(math.ceil(tokens / block_size)):  # ignores room left in the last block
                block = min(free)
                free.remove(block)
                tables.setdefault(seq, []).append(block)
        else:
            free.update(tables.pop(event[1], []))
    return tables


@register_cases(
    "ch06.block_tables",
    reference=reference_block_tables,
    wrong_answers=[_never_reuses, _new_blocks_every_append],
)
def cases_block_tables(rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        block_size, n_blocks = rng.choice([1, 2, 4, 16]), rng.randint(12, 40)
        cases.append(
            dict(
                events=random_events(rng, rng.randint(20, 80), n_blocks, block_size),
                n_blocks=n_blocks,
                block_size=block_size,
            )
        )
    return cases


# ---- 4. fragmentation of a paged cache --------------------------------------------------------------


def reference_paged_waste(lengths, block_size):
    # each sequence rounds up to whole blocks; only the tail of its last block is empty
    allocated = sum(math.ceil(n / block_size) * block_size for n in lengths)
    return (allocated - sum(lengths)) / allocated


@register_cases(
    "ch06.paged_waste",
    reference=reference_paged_waste,
    wrong_answers=[
        lambda lengths, block_size: sum(
            math.ceil(n / block_size) * block_size - n for n in lengths
        ),
        lambda lengths, block_size: (
            (math.ceil(sum(lengths) / block_size) * block_size - sum(lengths))
            / (math.ceil(sum(lengths) / block_size) * block_size)
        ),
    ],
)
def cases_paged_waste(rng):
    cases = [
        dict(
            lengths=[rng.randint(1, 3000) for _ in range(rng.randint(1, 64))],
            block_size=rng.choice([1, 4, 8, 16, 32, 128, 512]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return cases


# --- ch06.batch_speedups (measured) ---------------------------------------------------------


def batch_speedup_cases(rng, n_cases=8):
    """Decode steps for growing batches on a machine that slows down as the run goes on."""
    cases = []
    for _ in range(n_cases):
        batches = [1, 2, 4, 8, 16, 32, 64][: rng.randint(5, 7)]
        weights_s = rng.uniform(5e-3, 40e-3)
        spec = dict(
            weights_s=weights_s,
            kv_s_per_user=weights_s * rng.uniform(0.002, 0.02),
            compute_s_per_user=weights_s / rng.uniform(8, 80),  # compute takes over at B ~ 8-80
        )
        repeats = rng.randint(15, 25)
        run_s = repeats * sum(_true_step_s(spec, b) for b in batches)
        machine = noisy_machine(rng, **drifting(rng, run_s))
        bench = bench_spec("batch_steps", machine=machine, **spec)
        cases.append(dict(bench=bench, batches=batches, repeats=repeats))
    return cases


def _true_step_s(spec, batch):
    memory_s = spec["weights_s"] + batch * spec["kv_s_per_user"]
    return max(memory_s, batch * spec["compute_s_per_user"])


def reference_batch_speedups(bench, batches, repeats):
    # Tokens/s at each batch over tokens/s at the first, on the pretend machine's true times.
    first = batches[0] / _true_step_s(bench["spec"], batches[0])
    return [b / _true_step_s(bench["spec"], b) / first for b in batches]


def _timed_step(bench, batch):
    start = bench.clock()
    bench.step(batch)
    return bench.clock() - start


def _middle(values):
    return sorted(values)[len(values) // 2]


def _one_batch_after_another(bench, batches, repeats):  # medians, but drift separates batches
    for b in batches:
        bench.step(b)
        bench.step(b)
    steps = [_middle([_timed_step(bench, b) for _ in range(repeats)]) for b in batches]
    return [b / s / (batches[0] / steps[0]) for b, s in zip(batches, steps)]


def _step_rate_not_tokens(bench, batches, repeats):  # steps/s: forgets each step serves B users
    for b in batches:
        bench.step(b)
        bench.step(b)
    times = {b: [] for b in batches}
    for _ in range(repeats):
        for b in batches:
            times[b].append(_timed_step(bench, b))
    return [_middle(times[batches[0]]) / _middle(times[b]) for b in batches]


def _one_cold_round(bench, batches, repeats):  # one step each, slow first calls included
    steps = [_timed_step(bench, b) for b in batches]
    return [b / s / (batches[0] / steps[0]) for b, s in zip(batches, steps)]


@register_cases(
    "ch06.batch_speedups",
    reference=reference_batch_speedups,
    rtol=SPEEDUP_RTOL,
    measured=True,
    wrong_answers=[_one_batch_after_another, _step_rate_not_tokens, _one_cold_round],
)
def cases_batch_speedups(rng):
    return batch_speedup_cases(rng)
