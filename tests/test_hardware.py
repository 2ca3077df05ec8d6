"""Hardware catalog, roofline helpers and the measuring microbenchmarks (memwall.machine)."""

import dataclasses
import json

import pytest

from memwall.hardware import CATALOG, Hardware, get_hardware
from memwall.machine import microbench
from memwall.machine.microbench import measure


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
    with pytest.raises(ValueError, match="h100-sxm, .*this"):  # the machine room measures "this"
        microbench.get_hardware("tpu-v9")
    assert microbench.get_hardware("H100-SXM") is CATALOG["h100-sxm"]


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
    from memwall.machine.caches import DRAM, last_level_cache_bytes
    from memwall.machine.memory import BUDGET_CAP

    assert result.working_set_bytes <= BUDGET_CAP  # within the memory budget, whatever the cache
    # past the cache; or inside it, and then it says so, or that it spilled out of the part of
    # the cache this process gets (microbench.working_set_for)
    if result.memory_level == DRAM and "this process gets less of the cache" in result.note:
        assert result.cache_bandwidth > result.read_bandwidth
    elif result.memory_level == DRAM:
        assert result.working_set_bytes >= 2 * last_level_cache_bytes() and not result.note
    else:
        assert "this measures the cache, not DRAM" in result.note
        assert result.working_set_bytes <= last_level_cache_bytes()
    if result.device_type == "cpu" and last_level_cache_bytes():
        assert result.cache_bandwidth > 1e9
        assert result.cache_working_set_bytes <= last_level_cache_bytes() // 2
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
    from memwall.machine.fingerprint import has_native_bf16, same_machine

    result = measure(quick=True)
    assert same_machine(result.machine, result.machine) and result.machine["cpu_model"]
    if result.device_type == "cpu":
        assert ("bf16" in result.flops) == has_native_bf16(result.machine)
    if "bf16" in result.flops:
        assert 1e9 < result.flops["bf16"] < 1e16


@pytest.mark.parametrize("kernel_rate", [1e18, 1.0], ids=["kernel faster", "torch faster"])
def test_the_fp32_roof_is_the_faster_of_torchs_matmul_and_memwalls_kernel(monkeypatch, kernel_rate):
    """A BLAS that leaves the CPU's widest instructions unused (a vendor's library on another
    vendor's CPU) must not set a roof that memwall's own kernel beats; where the library is
    faster, its rate stands."""
    monkeypatch.setattr(microbench, "_memwall_kernel_flops", lambda repeats: kernel_rate)
    with_kernel = microbench._measure.__wrapped__("cpu", True, True)
    without = microbench._measure.__wrapped__("cpu", True, False)
    assert without.flops_source["fp32"] == "torch" and without.flops["fp32"] < 1e18
    if kernel_rate > 1e17:
        assert with_kernel.flops["fp32"] == kernel_rate
        assert with_kernel.flops_source["fp32"] == "memwall C kernel"
    else:
        assert with_kernel.flops_source["fp32"] == "torch" and with_kernel.flops["fp32"] > 1.0


def test_memwalls_fp32_kernel_rate_is_measured_where_the_kernels_run():
    from memwall.engine.cpu import kernels as cpu_kernels

    rate = cpu_kernels.fp32_flops(repeats=1)
    if not cpu_kernels.available():
        assert rate is None
        return
    assert 1e8 < rate < 1e14
    with cpu_kernels.switched_off():
        assert cpu_kernels.fp32_flops(repeats=1) is None


def test_info_prints_the_memory_limit_and_the_cores_it_may_use(capsys):
    from memwall.cli import main

    assert main(["info", "--quick", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "memory limit" in out and "cores this process may use" in out
    assert main(["info", "--quick", "--device", "cpu", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["core_limit"]["usable"] >= 1
    assert record["memory_limit"]["source"] in ("cgroup v2", "cgroup v1", "host")
    assert record["memory_level"] in ("DRAM", "last-level cache")
