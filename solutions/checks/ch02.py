"""Checks for chapter 2, "Arithmetic intensity and the roofline" (Williams et al., 2009).

A matmul [m x k] @ [k x n] does 2mkn FLOPs and, at best, moves (mk + kn + mn) elements of
`bytes_per_element` bytes. A chip with peak P FLOP/s and bandwidth B bytes/s attains at most
min(P, intensity x B); its ridge point is P / B. A measured run far slower than that floor is
overhead-bound (Horace He's third regime). Hidden cases span CPUs to H100-class GPUs.
"""

import math

from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12
BYTES_PER_ELEMENT = [4, 2, 1]  # fp32, bf16/fp16, int8/fp8
MAX_SEARCHED_ROWS = 100_000
# A run slower than this many times its roofline floor is overhead-bound (under 20% of the roof).
OVERHEAD_FACTOR = 5


# ---- references ------------------------------------------------------------------------------


def reference_matmul_intensity(m, k, n, bytes_per_element):
    flops = (
        2 * m * k * n
    )  # a multiply and an add for each of the k terms of each of the m x n outputs
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element  # read both inputs, write the output
    return flops / bytes_moved


def reference_regime(flops, bytes_moved, seconds, peak_flops, bandwidth):
    # The roofline's floor is the slower of the two roofs; a run far above it is explained by
    # neither (launches, Python, dispatch): overhead-bound.
    compute_s, memory_s = flops / peak_flops, bytes_moved / bandwidth
    if seconds > OVERHEAD_FACTOR * max(compute_s, memory_s):
        return "overhead"
    return "compute" if compute_s >= memory_s else "memory"


def reference_rows_to_reach_ridge(k, n, bytes_per_element, peak_flops, bandwidth):
    """Smallest m >= 1 with intensity(m) >= ridge, or math.inf if no m gets there.

    intensity(m) >= R  <=>  m (2kn - R b (k + n)) >= R b k n, so no m works unless 2kn > R b (k + n);
    otherwise start from the closed form and step to the exact integer with the intensity itself.
    """
    ridge = peak_flops / bandwidth
    spare = 2 * k * n - ridge * bytes_per_element * (k + n)
    if spare <= 0:
        return math.inf
    m = max(1, math.ceil(ridge * bytes_per_element * k * n / spare))
    while m > 1 and reference_matmul_intensity(m - 1, k, n, bytes_per_element) >= ridge:
        m -= 1
    while reference_matmul_intensity(m, k, n, bytes_per_element) < ridge:
        m += 1
    return m


# ---- random cases ----------------------------------------------------------------------------


def random_chip(rng):
    """A chip from a laptop CPU (ridge ~2) to an H100 (ridge ~300): (peak FLOP/s, bytes/s)."""
    bandwidth = rng.uniform(10e9, 5e12)
    return rng.uniform(1.0, 600.0) * bandwidth, bandwidth


def random_matmul(rng):
    return dict(
        m=rng.randint(1, 8192),
        k=rng.randint(64, 16384),
        n=rng.randint(64, 16384),
        bytes_per_element=rng.choice(BYTES_PER_ELEMENT),
    )


# ---- checks ----------------------------------------------------------------------------------


@register_cases(
    "ch02.intensity",
    reference=reference_matmul_intensity,
    wrong_answers=[
        lambda m, k, n, bytes_per_element: 2 * m * k * n / ((m * k + k * n) * bytes_per_element),
        lambda m, k, n, bytes_per_element: (
            m * k * n / ((m * k + k * n + m * n) * bytes_per_element)
        ),
        lambda m, k, n, bytes_per_element: 2 * m / bytes_per_element,
    ],
)
def cases_matmul_intensity(rng):
    cases = [random_matmul(rng) for _ in range(CASES_PER_CHECK)]
    cases[0]["m"] = 1  # a decode step
    return cases


def regime_cases(rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        peak_flops, bandwidth = random_chip(rng)
        bytes_moved = rng.uniform(1e4, 1e10)
        # Intensity clearly on one side of the ridge, and a time clearly near or far from the floor.
        side = rng.choice([rng.uniform(0.05, 0.7), rng.uniform(1.4, 20)])
        flops = side * (peak_flops / bandwidth) * bytes_moved
        floor = max(flops / peak_flops, bytes_moved / bandwidth)
        slow = rng.uniform(1.0, 3.0) if number % 3 else rng.uniform(8, 1000)
        cases.append(dict(flops=flops, bytes_moved=bytes_moved, seconds=floor * slow,
                          peak_flops=peak_flops, bandwidth=bandwidth))  # fmt: skip
    return cases


def _never_overhead(flops, bytes_moved, seconds, peak_flops, bandwidth):  # ignores the time
    return "compute" if flops / bytes_moved >= peak_flops / bandwidth else "memory"


def _any_gap_is_overhead(flops, bytes_moved, seconds, peak_flops, bandwidth):
    floor = max(flops / peak_flops, bytes_moved / bandwidth)
    return (
        "overhead"
        if seconds > floor
        else _never_overhead(flops, bytes_moved, seconds, peak_flops, bandwidth)
    )


def _ridge_upside_down(flops, bytes_moved, seconds, peak_flops, bandwidth):
    if seconds > OVERHEAD_FACTOR * max(flops / peak_flops, bytes_moved / bandwidth):
        return "overhead"
    return "memory" if flops / bytes_moved >= peak_flops / bandwidth else "compute"


@register_cases(
    "ch02.regime",
    reference=reference_regime,
    wrong_answers=[_never_overhead, _any_gap_is_overhead, _ridge_upside_down],
)
def check_regime(rng):
    return regime_cases(rng)


def _small_m_approximation(k, n, bytes_per_element, peak_flops, bandwidth):
    return max(1, math.ceil(peak_flops / bandwidth * bytes_per_element / 2))


def _one_row_short(k, n, bytes_per_element, peak_flops, bandwidth):
    rows = reference_rows_to_reach_ridge(k, n, bytes_per_element, peak_flops, bandwidth)
    return rows - 1 if rows > 1 else rows


@register_cases(
    "ch02.rows_to_ridge",
    reference=reference_rows_to_reach_ridge,
    wrong_answers=[_small_m_approximation, _one_row_short],
)
def cases_rows_to_reach_ridge(rng):
    cases = []
    while len(cases) < CASES_PER_CHECK:
        peak, bandwidth = random_chip(rng)
        side = rng.choice([512, 1024, 2048, 4096, 8192, 16384])
        case = dict(
            k=side,
            n=rng.choice([side, 4 * side // 3 // 64 * 64, side // 2]),
            bytes_per_element=rng.choice(BYTES_PER_ELEMENT),
            peak_flops=peak,
            bandwidth=bandwidth,
        )
        # Keep answers a row-by-row search finds quickly (just below the limit m grows without bound).
        if reference_rows_to_reach_ridge(**case) <= MAX_SEARCHED_ROWS:
            cases.append(case)
    # Always one case that no number of rows can push past the ridge: 16-bit, a narrow weight, a GPU.
    cases[-1] = dict(k=512, n=512, bytes_per_element=2, peak_flops=989e12, bandwidth=3.35e12)
    return cases
