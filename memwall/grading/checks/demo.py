"""Demo checks: the worked example of a check module, and the grader's own test fixture.

Each check receives the student's answer and a seeded ``random.Random``, draws hidden cases,
and compares against a reference that is written here, out of the student's sight. It returns
the number of cases that passed (``compare_function`` does that) or raises ``AssertionError``.
"""

from memwall.grading import compare_function, register

CASES_PER_CHECK = 12


def reference_matrix_bytes(rows, cols, bytes_per_element):
    return rows * cols * bytes_per_element


def reference_matmul_intensity(m, n, k, bytes_per_element):
    # (m x k) @ (k x n): one multiply and one add per term; read both inputs, write the output once.
    flops = 2 * m * n * k
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element
    return flops / bytes_moved


def reference_decode_ceilings(bandwidth_gb_s, model_sizes_gb):
    # Each generated token reads every weight once, so tokens/s <= bandwidth / model size.
    return [bandwidth_gb_s / size for size in model_sizes_gb]


@register("demo.matrix_bytes", wrong_answers=[lambda rows, cols, bytes_per_element: rows * cols])
def check_matrix_bytes(student, rng):
    cases = [
        dict(
            rows=rng.randint(1, 8192),
            cols=rng.randint(1, 8192),
            bytes_per_element=rng.choice([1, 2, 4]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_matrix_bytes, cases)


@register(
    "demo.matmul_intensity",
    wrong_answers=[
        lambda m, n, k, bytes_per_element: m * n * k / ((m * k + k * n + m * n) * bytes_per_element)
    ],
)
def check_matmul_intensity(student, rng):
    cases = [
        dict(
            m=rng.randint(1, 4096),
            n=rng.randint(1, 4096),
            k=rng.randint(1, 4096),
            bytes_per_element=rng.choice([1, 2, 4]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_matmul_intensity, cases)


@register(
    "demo.decode_ceilings",
    wrong_answers=[
        lambda bandwidth_gb_s, model_sizes_gb: [s / bandwidth_gb_s for s in model_sizes_gb]
    ],
)
def check_decode_ceilings(student, rng):
    cases = [
        dict(
            bandwidth_gb_s=rng.uniform(20, 4800),
            model_sizes_gb=[rng.uniform(0.1, 140) for _ in range(rng.randint(1, 5))],
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_decode_ceilings, cases)
