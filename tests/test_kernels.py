"""memwall's C kernels: the checks before a pointer reaches C, and every kernel variant against
the reference path on the shapes it serves."""

import pytest
import torch
import torch.nn.functional as F

from memwall.engine import cpu_kernels
from memwall.engine.linear import Linear
from memwall.engine.quant import Int4Linear, Int8Linear

needs_cpu_kernels = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}"
)


def seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def f_linear_error(x, weight) -> str:
    with pytest.raises(RuntimeError) as caught:
        F.linear(x, weight)
    return str(caught.value)


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda w: Linear(32, 64).set_weight(w),
        lambda w: Int8Linear.from_weight(w),
        lambda w: Int4Linear.from_weight(w, group_size=32),
    ],
    ids=["fp32", "int8", "int4"],
)
def test_a_wrong_input_width_raises_what_f_linear_raises(make_layer):
    weight = seeded(64, 32)
    layer = make_layer(weight)
    x = seeded(1, 40, seed=1)  # wider than the layer: C would read past the weights
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        layer(x)


@needs_cpu_kernels
def test_the_kernel_wrappers_check_before_calling_c():
    weight = seeded(64, 32)
    x = seeded(1, 40, seed=1)
    with pytest.raises(RuntimeError) as caught:
        cpu_kernels.fp32_linear(x, weight)
    assert str(caught.value) == f_linear_error(x, weight)
    codes = torch.zeros(64, 32, dtype=torch.int8)
    scales = torch.ones(64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cpu_kernels.int8_linear(x, codes, scales)
    with pytest.raises(TypeError, match="bfloat16"):  # scales of the wrong dtype
        cpu_kernels.int8_linear(seeded(1, 32), codes, scales.float())
    with pytest.raises(TypeError, match="fp32 CPU activations"):
        cpu_kernels.fp32_linear(seeded(1, 32).double(), weight)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.fp32_linear(seeded(1, 64), seeded(64, 64).t())
    packed = torch.zeros(64, 16, dtype=torch.uint8)
    scale_zero = torch.ones(1, 64, 2, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cpu_kernels.int4_linear(x, packed, scale_zero, 32)
    with pytest.raises(TypeError, match="scale_zero"):
        cpu_kernels.int4_linear(seeded(1, 32), packed, scale_zero[:, :32], 32)


@needs_cpu_kernels
def test_the_output_dtype_follows_the_input_not_the_default_dtype():
    weight, x = seeded(64, 32), seeded(2, 32, seed=1)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        out = cpu_kernels.fp32_linear(x, weight)
        int8 = Int8Linear.from_weight(weight)
        int8_out = cpu_kernels.int8_linear(x, int8.codes, int8.scales)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == int8_out.dtype == torch.float32
    assert torch.allclose(out, x @ weight.t(), atol=1e-5)
