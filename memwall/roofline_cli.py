"""`memwall info` (the roofline of this machine, measured) and `memwall calc` (the roofline
arithmetic of one decode step of a catalog model on a catalog chip). `calc` needs no torch."""

from __future__ import annotations

import dataclasses
import json
import sys

from memwall import cost
from memwall.cli import COMMANDS, require_extra
from memwall.hardware import CATALOG as HARDWARE_CATALOG
from memwall.machine.caches import DRAM
from memwall.machine.microbench import MEASURED_NAME, get_hardware, measure
from memwall.machine.working_set import LAST_LEVEL_CACHE
from memwall.specs import CATALOG as MODEL_CATALOG
from memwall.units import human_bytes, parameter_count, print_table, seconds, si


def register_cli(subparsers) -> None:
    add_info_parser(subparsers)
    add_calc_parser(subparsers)


# ---- info --------------------------------------------------------------------------------------


def add_info_parser(subparsers) -> None:
    parser = subparsers.add_parser("info", help=COMMANDS["info"].help)
    parser.add_argument(
        "--device", help="torch device to measure (default: cuda if present, else cpu)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller (still beyond-cache) working set"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_info)


def _usable_device(name: str | None):
    """`name` as a torch device this torch can use, else a ValueError naming what it can use."""
    import torch

    if (
        name is None
    ):  # the command prefers a GPU when there is one (the library defaults to the CPU)
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; choose cpu, cuda, cuda:N or mps.") from None
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if device.type != "cpu" and not (backend and backend.is_available()):
        raise ValueError(
            f"device {name!r} is not available to this torch ({torch.__version__}); use --device cpu."
        )
    return device


def run_info(args) -> int:
    device = _usable_device(args.device)
    # The measurement is silent for seconds (longer without --quick): say what is happening first.
    print(
        f"memwall info: measuring {device}'s bandwidth and FLOP/s ...", file=sys.stderr, flush=True
    )
    try:
        result = measure(device, quick=args.quick)
    except (RuntimeError, AssertionError) as error:  # torch's answer to a device it cannot use
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        raise ValueError(f"cannot measure device {args.device!r}: {first_line}") from None
    ridge = {dtype: cost.ridge_point(result.as_hardware(), dtype) for dtype in result.flops}
    kernels = result.device_type == "cpu"  # memwall's CPU kernels and the path chosen per format
    limits = _limits()
    if args.json:
        record = {**dataclasses.asdict(result), "ridge_point": ridge, **limits}
        if kernels:
            from memwall.engine.cpu import chosen_paths

            record["kernels"] = chosen_paths()
        print(json.dumps(record, indent=2))
        return 0
    memory, cores = limits["memory_limit"], limits["core_limit"]
    rows = [
        ("device", f"{result.device} ({result.device_type})"),
        ("torch", result.torch_version),
        ("threads", f"{result.threads}; cores this process may use: {cores['describe']}"),
        ("memory", human_bytes(result.memory_bytes)),
        ("memory limit", _describe_memory(memory)),
        (
            f"bandwidth, {result.memory_level}",
            f"{si(result.bandwidth, 'B/s')}  (read {si(result.read_bandwidth, 'B/s')}, "
            f"copy {si(result.copy_bandwidth, 'B/s')}, "
            f"over {human_bytes(result.working_set_bytes)})",
        ),
    ]
    if result.note:
        rows.append(("", result.note))
    if result.cache_bandwidth and result.memory_level == DRAM:
        rows.append(
            (
                f"bandwidth, {LAST_LEVEL_CACHE}",
                f"{si(result.cache_bandwidth, 'B/s')}  (read, over "
                f"{human_bytes(result.cache_working_set_bytes)})",
            )
        )
    kernel_note = {"memwall C kernel": ", memwall's C kernel"}  # where PyTorch's matmul lost
    rows += [
        (
            f"matmul {dtype}",
            f"{si(rate, 'FLOP/s')}  (ridge point {ridge[dtype]:.3g} FLOPs/byte"
            f"{kernel_note.get(result.flops_source.get(dtype), '')})",
        )
        for dtype, rate in result.flops.items()
    ]
    if kernels:
        from memwall.engine.cpu import info_rows

        rows += info_rows()
    print_table("memwall info: the roofline of this machine (best of several runs)", rows)
    return 0


def _limits() -> dict:
    """The container's memory limit and the cores this process may use, as JSON-ready fields."""
    from memwall.machine.cores import core_limit
    from memwall.machine.memory import memory_limit

    memory, cores = memory_limit(), core_limit()
    return {
        "memory_limit": {
            **dataclasses.asdict(memory),
            "total_bytes": memory.total_bytes,
            "available_bytes": memory.available_bytes,
        },
        "core_limit": {
            **dataclasses.asdict(cores),
            "usable": cores.usable,
            "describe": cores.describe(),
        },
    }


def _describe_memory(memory: dict) -> str:
    available = f"{human_bytes(memory['available_bytes'])} available"
    if memory["limit_bytes"] is None:
        return f"none set (the host's memory; {available})"
    return f"{human_bytes(memory['limit_bytes'])} ({memory['source']}; {available})"


# ---- calc --------------------------------------------------------------------------------------


def add_calc_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "calc",
        help=COMMANDS["calc"].help,
        description="Roofline arithmetic for decoding one token for each of BATCH sequences of CONTEXT tokens.",
    )
    parser.add_argument("--model", required=True, help=f"one of: {', '.join(MODEL_CATALOG)}")
    parser.add_argument(
        "--hardware",
        required=True,
        help=f"one of: {', '.join(HARDWARE_CATALOG)}, or '{MEASURED_NAME}' to measure this machine",
    )
    parser.add_argument(
        "--dtype", default="bf16", help="weight dtype, e.g. fp32, bf16, int8, int4, q4_1"
    )
    parser.add_argument("--kv-dtype", help="KV cache dtype (default: the compute dtype)")
    parser.add_argument("--context", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    parser.add_argument(
        "--kv-heads", type=int, help="override the model's KV heads (MHA/GQA/MQA what-ifs)"
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"with --hardware {MEASURED_NAME}: measure quickly"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_calc)


def run_calc(args) -> int:
    hardware = args.hardware
    measured = hardware.strip().lower() == MEASURED_NAME
    if args.quick and not measured:
        raise ValueError(f"--quick applies to --hardware {MEASURED_NAME} (a measurement).")
    if measured:
        require_extra("engine", f"--hardware {MEASURED_NAME} (measuring this machine)")
        hardware = measure(_usable_device(None), quick=args.quick).as_hardware()
    hardware = get_hardware(hardware)
    result = cost.calc(
        args.model,
        hardware,
        dtype=args.dtype,
        context=args.context,
        batch=args.batch,
        kv_dtype=args.kv_dtype,
        kv_heads=args.kv_heads,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    r = result
    fits = "fits" if r["fits"] else "does NOT fit"
    kv_heads = f", {r['n_kv_heads']} KV heads" if args.kv_heads is not None else ""
    print_table(
        f"memwall calc: {r['model']} on {r['hardware']}, {r['dtype']} weights, {r['kv_dtype']} KV cache{kv_heads}, "
        f"{r['batch']} sequence{'s' if r['batch'] > 1 else ''} x {r['context']} tokens",
        [
            (
                "parameters",
                f"{parameter_count(r['n_params'])} (active per token: {parameter_count(r['n_params_active'])})",
            ),
            ("weights read per step", human_bytes(r["weight_bytes"])),
            ("KV cache per token", human_bytes(r["kv_bytes_per_token"])),
            ("KV cache per sequence", human_bytes(r["kv_bytes_per_user"])),
            ("KV cache, whole batch", human_bytes(r["kv_bytes_total"])),
            ("bytes per step", human_bytes(r["bytes_per_step"])),
            ("FLOPs per step", si(r["flops_per_step"], "FLOP")),
            (
                "arithmetic intensity",
                f"{r['arithmetic_intensity']:.3g} FLOPs/byte "
                f"(ridge point {r['ridge_point']:.3g}: "
                + (f"{r['bound']}-bound)" if r["bound"] != "mixed" else "each row its own bound)"),
            ),
            *(
                (
                    f"  {label}",
                    f"{si(r[f'{row}_flops'], 'FLOP')}, {si(r[f'{row}_bytes'], 'B')}: "
                    f"{r[f'{row}_arithmetic_intensity']:.3g} FLOPs/byte, "
                    f"{r[f'{row}_bound']}-bound, >= {seconds(r[f'{row}_time_s'])}",
                )
                for label, row in (("weight matmuls", "matmul"), ("attention", "attention"))
            ),
            ("memory-bound time", seconds(r["memory_time_s"])),
            ("compute-bound time", seconds(r["compute_time_s"])),
            ("step time at least", seconds(r["step_time_s"])),
            (
                "tokens/s at most",
                f"{r['tokens_per_s_per_user']:,.1f} per sequence, "
                f"{r['tokens_per_s_total']:,.1f} in total",
            ),
            (
                "memory needed",
                f"{human_bytes(r['memory_needed_bytes'])} of {human_bytes(r['memory_bytes'])}: {fits}",
            ),
            (f"max sequences of {r['context']}", f"{r['max_users']:,}"),
        ],
    )
    return 0
