"""Checks for chapter 7 (quantization).

1. ``ch07.bits_per_weight``: storage bits per weight of a group-wise format (code + metadata share).
2. ``ch07.symmetric_quantize``: per-row symmetric (absmax) quantization to `bits`, returned dequantized.
3. ``ch07.format_speedups`` (measured): each format's speed-up over fp32, timed interleaved on a
   pretend machine with a fake clock.
4. ``ch07.format_that_fits``: the most precise weight format whose weights plus the users' KV
   cache fit a memory budget.
"""

import numpy as np

from memwall.fakeclock import bench_spec
from memwall.grading import numpy_rng
from memwall.grading.measured_compare import drifting, noisy_machine
from memwall.grading.registry import register_cases
from memwall.widgets.practice import relative_rms_error  # noqa: F401

# A sound interleaved method lands within ~2% of the true speed-ups; drift moves a naive one 10%+.
SPEEDUP_RTOL = 0.06

CASES_PER_CHECK = 12


# ---- 1. bits per weight --------------------------------------------------------------------------


def reference_bits_per_weight(code_bits, group_size, metadata_bits):
    # every weight stores its code; each group's metadata is shared by its group_size weights
    return code_bits + metadata_bits / group_size


@register_cases(
    "ch07.bits_per_weight",
    reference=reference_bits_per_weight,
    rtol=1e-09,
    wrong_answers=[
        lambda code_bits, group_size, metadata_bits: code_bits + metadata_bits * group_size,
        lambda code_bits, group_size, metadata_bits: (code_bits + metadata_bits / group_size) / 8,
        lambda code_bits, group_size, metadata_bits: code_bits,
    ],
)
def cases_bits_per_weight(rng):
    cases = [
        dict(
            code_bits=rng.choice([2, 3, 4, 5, 6, 8]),
            group_size=rng.choice([16, 32, 64, 128, 256, 576]),
            metadata_bits=rng.choice([16, 32, 48]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return cases


# ---- 2. symmetric quantization --------------------------------------------------------------------


def reference_symmetric_quantize(w, bits):
    w = np.asarray(w, dtype=np.float32)
    levels = (
        2 ** (bits - 1) - 1
    )  # int8: -127..127, int4: -7..7 (symmetric, zero exactly representable)
    scale = np.abs(w).max(axis=1, keepdims=True) / levels
    scale = np.where(scale == 0, 1, scale)  # an all-zero row stays zero
    return np.clip(np.round(w / scale), -levels, levels) * scale


def _per_tensor_scale(w, bits):
    levels = 2 ** (bits - 1) - 1
    scale = np.abs(w).max() / levels
    return np.round(np.asarray(w) / scale) * scale


def _too_many_levels(w, bits):
    levels = 2**bits - 1
    scale = np.abs(w).max(axis=1, keepdims=True) / levels
    return np.round(np.asarray(w) / scale) * scale


@register_cases(
    "ch07.symmetric_quantize",
    reference=reference_symmetric_quantize,
    rtol=1e-05,
    atol=1e-06,
    wrong_answers=[
        _per_tensor_scale,
        _too_many_levels,
        lambda w, bits: np.asarray(w, dtype=np.float32),
    ],
)
def cases_symmetric_quantize(rng):
    nprng = numpy_rng(rng)
    cases = []
    for _ in range(CASES_PER_CHECK):
        w = nprng.normal(0, 1, (rng.randint(2, 8), rng.randint(4, 40))).astype(np.float32)
        w *= nprng.uniform(0.1, 10, (w.shape[0], 1)).astype(
            np.float32
        )  # rows with different ranges
        cases.append(dict(w=w, bits=rng.choice([2, 3, 4, 6, 8])))
    return cases


# ---- 4. the format that fits a memory budget -----------------------------------------------------


def reference_format_that_fits(n_params, bits_per_weight, kv_bytes_per_token, context, users,
                               memory_bytes):  # fmt: skip
    # The most precise weight format whose weights plus every user's KV cache fit; None if none does.
    kv_bytes = kv_bytes_per_token * context * users
    fitting = [
        (bits, name)
        for name, bits in bits_per_weight.items()
        if n_params * bits / 8 + kv_bytes <= memory_bytes
    ]
    return max(fitting)[1] if fitting else None


FORMAT_BITS = {"bf16": 16.0, "int8": 8.5, "q5_1": 6.0, "q4_1": 5.0, "q3_k": 3.4375}


def fit_cases(rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        n_params = rng.uniform(0.5e9, 70e9)
        kv_bytes_per_token = rng.choice([32, 64, 128, 160, 320]) * 1024
        context, users = rng.randint(512, 131072), rng.randint(1, 64)
        kv_bytes = kv_bytes_per_token * context * users
        # A budget that lands between two formats (or below the smallest, every sixth case).
        target = rng.choice(list(FORMAT_BITS.values())) * rng.uniform(1.02, 1.1)
        if number % 6 == 5:
            target = min(FORMAT_BITS.values()) * rng.uniform(0.5, 0.95)
        cases.append(dict(n_params=n_params, bits_per_weight=dict(FORMAT_BITS),
                          kv_bytes_per_token=kv_bytes_per_token, context=context, users=users,
                          memory_bytes=n_params * target / 8 + kv_bytes))  # fmt: skip
    return cases


def _weights_only(n_params, bits_per_weight, kv_bytes_per_token, context, users, memory_bytes):
    return reference_format_that_fits(n_params, bits_per_weight, 0, context, users, memory_bytes)


def _one_user_only(n_params, bits_per_weight, kv_bytes_per_token, context, users, memory_bytes):
    return reference_format_that_fits(
        n_params, bits_per_weight, kv_bytes_per_token, context, 1, memory_bytes
    )


def _smallest_that_fits(n_params, bits_per_weight, kv_bytes_per_token, context, users,
                        memory_bytes):  # fmt: skip
    kv_bytes = kv_bytes_per_token * context * users
    fitting = [(bits, name) for name, bits in bits_per_weight.items()
               if n_params * bits / 8 + kv_bytes <= memory_bytes]  # fmt: skip
    return min(fitting)[1] if fitting else None


@register_cases(
    "ch07.format_that_fits",
    reference=reference_format_that_fits,
    wrong_answers=[_weights_only, _one_user_only, _smallest_that_fits],
)
def check_format_that_fits(rng):
    return fit_cases(rng)


# ---- 3. format speed-ups, measured on a fake clock ----------------------------------------------

FORMATS = ["fp32", "int8", "int4"]


def format_speedup_cases(rng, n_cases=8):
    """Matrix-vector products in three weight formats, on a machine that drifts and jumps."""
    cases = []
    for _ in range(n_cases):
        fp32_s = rng.uniform(2e-3, 40e-3)
        # int8 reads 1/4 of the bytes and int4 ~1/7, but unpacking eats part of the saving.
        seconds = {
            "fp32": fp32_s,
            "int8": fp32_s * rng.uniform(0.28, 0.6),
            "int4": fp32_s * rng.uniform(0.18, 0.6),
        }
        repeats = rng.randint(15, 25)
        machine = noisy_machine(rng, **drifting(rng, repeats * sum(seconds.values())))
        bench = bench_spec("formats", machine=machine, seconds_by_format=seconds)
        cases.append(dict(bench=bench, formats=list(FORMATS), repeats=repeats))
    return cases


def reference_format_speedups(bench, formats, repeats):
    # How many times faster each format's product is than fp32's, on the true times.
    seconds = bench["spec"]["seconds_by_format"]
    return {name: seconds["fp32"] / seconds[name] for name in formats}


def _timed_matvec(bench, name):
    start = bench.clock()
    bench.matvec(name)
    return bench.clock() - start


def _middle(values):
    return sorted(values)[len(values) // 2]


def _format_after_format(bench, formats, repeats):  # medians, but drift separates the formats
    for name in formats:
        bench.matvec(name)
        bench.matvec(name)
    medians = {
        name: _middle([_timed_matvec(bench, name) for _ in range(repeats)]) for name in formats
    }
    return {name: medians["fp32"] / medians[name] for name in formats}


def _interleaved_totals(bench, formats, repeats):  # interleaved, but totals keep the outliers
    totals = dict.fromkeys(formats, 0.0)
    for _ in range(repeats):
        for name in formats:
            totals[name] += _timed_matvec(bench, name)
    return {name: totals["fp32"] / totals[name] for name in formats}


def _one_cold_call_each(bench, formats, repeats):  # the first call builds the kernel
    times = {name: _timed_matvec(bench, name) for name in formats}
    return {name: times["fp32"] / times[name] for name in formats}


@register_cases(
    "ch07.format_speedups",
    reference=reference_format_speedups,
    rtol=SPEEDUP_RTOL,
    measured=True,
    wrong_answers=[_format_after_format, _interleaved_totals, _one_cold_call_each],
)
def cases_format_speedups(rng):
    return format_speedup_cases(rng)
