"""Checks for chapter 7 (quantization).

1. ``ch07.bits_per_weight``: storage bits per weight of a group-wise format (code + metadata share).
2. ``ch07.symmetric_quantize``: per-row symmetric (absmax) quantization to `bits`, returned dequantized.
3. ``ch07.pack_int4``: two 4-bit codes per byte, even index in the low nibble.
4. ``ch07.decode_q4_1_block``: one 20-byte GGUF Q4_1 block -> 32 float32 weights, x = d * q + m.
"""

import numpy as np

from memwall.fakeclock import bench_spec
from memwall.grading import compare_function, numpy_rng, register
from memwall.grading.checks.measured import compare_measured, drifting, noisy_machine

# A sound interleaved method lands within ~2% of the true speed-ups; drift moves a naive one 10%+.
SPEEDUP_RTOL = 0.06

CASES_PER_CHECK = 12


# ---- 1. bits per weight --------------------------------------------------------------------------


def reference_bits_per_weight(code_bits, group_size, metadata_bits):
    # every weight stores its code; each group's metadata is shared by its group_size weights
    return code_bits + metadata_bits / group_size


@register(
    "ch07.bits_per_weight",
    wrong_answers=[
        lambda code_bits, group_size, metadata_bits: code_bits + metadata_bits * group_size,
        lambda code_bits, group_size, metadata_bits: (code_bits + metadata_bits / group_size) / 8,
        lambda code_bits, group_size, metadata_bits: code_bits,
    ],
)
def check_bits_per_weight(student, rng):
    cases = [
        dict(
            code_bits=rng.choice([2, 3, 4, 5, 6, 8]),
            group_size=rng.choice([16, 32, 64, 128, 256, 576]),
            metadata_bits=rng.choice([16, 32, 48]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_bits_per_weight, cases, rtol=1e-9)


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


@register(
    "ch07.symmetric_quantize",
    wrong_answers=[
        _per_tensor_scale,
        _too_many_levels,
        lambda w, bits: np.asarray(w, dtype=np.float32),
    ],
)
def check_symmetric_quantize(student, rng):
    nprng = numpy_rng(rng)
    cases = []
    for _ in range(CASES_PER_CHECK):
        w = nprng.normal(0, 1, (rng.randint(2, 8), rng.randint(4, 40))).astype(np.float32)
        w *= nprng.uniform(0.1, 10, (w.shape[0], 1)).astype(
            np.float32
        )  # rows with different ranges
        cases.append(dict(w=w, bits=rng.choice([2, 3, 4, 6, 8])))
    return compare_function(student, reference_symmetric_quantize, cases, rtol=1e-5, atol=1e-6)


def relative_rms_error(quantize, bits, outlier=0.0, seed=0):
    """How far `quantize(w, bits)` lands from w, relative to w's RMS, on a fixed random matrix with
    one weight per row multiplied by `outlier` (for the widget)."""
    w = np.random.default_rng(seed).normal(0, 1, (64, 256)).astype(np.float32)
    if outlier:
        w[:, 0] *= outlier
    error = np.asarray(quantize(w, bits), dtype=np.float64) - w
    return float(np.sqrt((error**2).mean()) / np.sqrt((w.astype(np.float64) ** 2).mean()))


# ---- 3. packing two int4 codes into a byte --------------------------------------------------------------


def reference_pack_int4(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


@register(
    "ch07.pack_int4",
    wrong_answers=[
        lambda codes: (
            np.asarray(codes, dtype=np.uint8)[1::2] | (np.asarray(codes, dtype=np.uint8)[0::2] << 4)
        ),
        lambda codes: np.asarray(codes, dtype=np.uint8)[0::2],
        lambda codes: (np.asarray(codes)[0::2] + np.asarray(codes)[1::2]).astype(np.uint8),
    ],
)
def check_pack_int4(student, rng):
    nprng = numpy_rng(rng)
    cases = [
        dict(codes=nprng.integers(0, 16, 2 * rng.randint(1, 32)).astype(np.uint8))
        for _ in range(CASES_PER_CHECK)
    ]
    cases[0] = dict(codes=np.array([0x3, 0xA], dtype=np.uint8))  # the byte 0xA3
    return compare_function(student, reference_pack_int4, cases, rtol=0)


def packed_byte(pack, low, high):
    """The byte `pack` makes of the codes [low, high] (for the widget)."""
    return int(np.asarray(pack(np.array([low, high], dtype=np.uint8)))[0])


# ---- 4. a Q4_1 block decoder ------------------------------------------------------------------------


def reference_decode_q4_1_block(block):
    block = np.asarray(block, dtype=np.uint8)
    d = np.float32(block[0:2].view(np.float16)[0])
    m = np.float32(block[2:4].view(np.float16)[0])
    codes = np.concatenate([block[4:20] & 0x0F, block[4:20] >> 4]).astype(np.float32)
    return d * codes + m


def make_q4_1_block(d, m, codes):
    """20 bytes: fp16 d, fp16 m, then 32 codes (weight i low nibble, weight i + 16 high nibble)."""
    codes = np.asarray(codes, dtype=np.uint8)
    head = np.array([d, m], dtype=np.float16).view(np.uint8)
    return np.concatenate([head, codes[:16] | (codes[16:] << 4)]).astype(np.uint8)


def _interleaved_nibbles(block):
    block = np.asarray(block, dtype=np.uint8)
    d, m = (np.float32(block[i : i + 2].view(np.float16)[0]) for i in (0, 2))
    codes = np.stack([block[4:20] & 0x0F, block[4:20] >> 4], axis=1).reshape(-1).astype(np.float32)
    return d * codes + m


@register(
    "ch07.decode_q4_1_block",
    wrong_answers=[
        _interleaved_nibbles,
        lambda block: (
            reference_decode_q4_1_block(block)
            - np.float32(np.asarray(block, np.uint8)[2:4].view(np.float16)[0])
        ),
        lambda block: reference_decode_q4_1_block(
            np.concatenate(
                [
                    np.asarray(block, np.uint8)[2:4],
                    np.asarray(block, np.uint8)[0:2],
                    np.asarray(block, np.uint8)[4:],
                ]
            )
        ),
    ],
)
def check_decode_q4_1_block(student, rng):
    nprng = numpy_rng(rng)
    cases = [
        dict(
            block=make_q4_1_block(
                nprng.uniform(1e-3, 0.1), nprng.uniform(-1, 0), nprng.integers(0, 16, 32)
            )
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_decode_q4_1_block, cases, rtol=1e-6)


# --- ch07.format_speedups (measured) --------------------------------------------------------

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


@register(
    "ch07.format_speedups",
    wrong_answers=[_format_after_format, _interleaved_totals, _one_cold_call_each],
)
def check_format_speedups(student, rng):
    return compare_measured(
        student, reference_format_speedups, format_speedup_cases(rng), rtol=SPEEDUP_RTOL
    )
