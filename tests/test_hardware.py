"""Hardware catalog, roofline helpers and the measuring microbenchmarks."""

import dataclasses

import pytest

from memwall.hardware import CATALOG, Hardware, get_hardware, measure


def test_catalog_has_the_chips_the_book_uses():
    for name in ("h100-sxm", "h200", "a100-80gb", "l4", "t4", "apple-m2-max", "laptop-100gbs"):
        assert name in CATALOG


def test_h100_uses_dense_rates():
    h100 = CATALOG["h100-sxm"]
    assert h100.memory_bandwidth == 3.35e12
    assert h100.flops("bf16") == 989e12  # not the 1,979 "with sparsity"
    assert round(h100.ridge_point("bf16")) == 295


def test_h200_has_h100_compute_and_more_memory():
    h100, h200 = CATALOG["h100-sxm"], CATALOG["h200"]
    assert h200.peak_flops == h100.peak_flops
    assert h200.memory_bandwidth == 4.8e12 and h200.memory_bytes == 141e9


def test_worked_example_laptop():
    assert CATALOG["laptop-100gbs"].memory_bandwidth == 100e9


def test_unknown_dtype_and_name_raise_with_choices():
    with pytest.raises(ValueError, match="fp16"):
        CATALOG["t4"].flops("bf16")  # Turing has no bf16
    with pytest.raises(ValueError, match="h100-sxm"):
        get_hardware("tpu-v9")


def test_get_hardware_passes_objects_through_and_ignores_case():
    assert get_hardware("H100-SXM") is CATALOG["h100-sxm"]
    assert get_hardware(CATALOG["l4"]) is CATALOG["l4"]


@pytest.mark.parametrize(
    "change",
    [
        {"memory_bandwidth": 0},
        {"memory_bytes": -1},
        {"peak_flops": {}},
        {"peak_flops": {"fp64": 1e12}},
        {"peak_flops": {"fp32": 0}},
    ],
)
def test_invalid_hardware_raises(change):
    with pytest.raises(ValueError):
        dataclasses.replace(CATALOG["l4"], **change)


def test_measure_quick_is_plausible_and_cached():
    result = measure(quick=True)
    assert result.device_type in ("cpu", "cuda")
    from memwall.fingerprint import last_level_cache_bytes

    assert result.working_set_bytes >= 4 * last_level_cache_bytes()  # far beyond the LLC
    assert 1e9 < result.bandwidth < 1e13  # between 1 GB/s and 10 TB/s
    assert result.bandwidth == max(result.read_bandwidth, result.copy_bandwidth)
    assert 1e9 < result.flops["fp32"] < 1e15
    assert result.threads >= 1 and result.torch_version
    assert measure(quick=True) is result  # second call comes from the cache

    hardware = result.as_hardware()
    assert isinstance(hardware, Hardware)
    assert hardware.name == f"this-{result.device_type}"
    assert hardware.memory_bandwidth == result.bandwidth
    assert hardware.flops("fp32") == result.flops["fp32"]


def test_measure_takes_a_bf16_roof_exactly_where_the_cpu_has_bf16():
    from memwall.fingerprint import has_native_bf16, same_machine

    result = measure(quick=True)
    assert same_machine(result.machine, result.machine) and result.machine["cpu_model"]
    if result.device_type == "cpu":
        assert ("bf16" in result.flops) == has_native_bf16(result.machine)
    if "bf16" in result.flops:
        assert 1e9 < result.flops["bf16"] < 1e16


@pytest.mark.parametrize("kernel_rate", [1e18, 1.0], ids=["kernel faster", "torch faster"])
def test_the_fp32_roof_is_the_faster_of_torchs_matmul_and_memwalls_kernel(monkeypatch, kernel_rate):
    """A BLAS that leaves the CPU's widest instructions unused (MKL on AMD) must not set a roof
    that memwall's own kernel beats; where the library is faster, its rate stands."""
    from memwall import hardware

    monkeypatch.setattr(hardware, "_memwall_kernel_flops", lambda repeats: kernel_rate)
    with_kernel = hardware._measure.__wrapped__("cpu", True, True)
    without = hardware._measure.__wrapped__("cpu", True, False)
    assert without.flops_source["fp32"] == "torch" and without.flops["fp32"] < 1e18
    if kernel_rate > 1e17:
        assert with_kernel.flops["fp32"] == kernel_rate
        assert with_kernel.flops_source["fp32"] == "memwall C kernel"
    else:
        assert with_kernel.flops_source["fp32"] == "torch" and with_kernel.flops["fp32"] > 1.0


def test_memwalls_fp32_kernel_rate_is_measured_where_the_kernels_run():
    from memwall.engine import cpu_kernels

    rate = cpu_kernels.fp32_flops(repeats=1)
    if not cpu_kernels.available():
        assert rate is None
        return
    assert 1e8 < rate < 1e14
    with cpu_kernels.switched_off():
        assert cpu_kernels.fp32_flops(repeats=1) is None
