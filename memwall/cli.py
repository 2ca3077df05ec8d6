"""The `memwall` command.

`info` and `calc` live here. Other commands live next to the code they drive and plug in:
a module listed in PLUGIN_COMMANDS defines

    def register_cli(subparsers):
        parser = subparsers.add_parser("bench", help="...")
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(run=run_bench)   # run(args) -> exit code (None means 0)

A plugin module is imported only when its command runs (or for --help), so `memwall calc` never
pays for torch, and a module that does not exist yet simply has no command. A `ValueError` raised
by any command becomes a one-line error and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import sys

from memwall import cost
from memwall.hardware import CATALOG as HARDWARE_CATALOG
from memwall.hardware import MEASURED_NAME, get_hardware, measure
from memwall.specs import CATALOG as MODEL_CATALOG

# command -> module whose register_cli(subparsers) adds it. One module may add several commands.
PLUGIN_COMMANDS = {
    "bench": "memwall.bench",
    "generate": "memwall.generate",
    "grade": "memwall.grading",
    "exercises": "memwall.grading",
    "notebooks": "memwall.notebooks",
    "serve": "memwall.serving.cli",
}

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input; main() prints it on one line."""


class _Parser(argparse.ArgumentParser):
    # argparse would print the usage block and call sys.exit; one clear line is friendlier.
    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message}")


# ---- formatting ------------------------------------------------------------------------------

_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str) -> str:
    """4 significant digits with an SI prefix: si(16.06e9, 'B') == '16.06 GB'."""
    for scale, prefix in _SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def human_bytes(n: float) -> str:
    """Decimal and binary units side by side, since datasheets use GB and memory is sized in GiB."""
    for power, prefix in ((5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
        if n >= 1024**power:
            return f"{si(n, 'B')} ({n / 1024**power:.4g} {prefix}B)"
    return f"{n:.4g} B"


def parameter_count(n: float) -> str:
    """Parameter counts the way model names write them: 8.03B, 135M."""
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.4g}M"


def seconds(t: float) -> str:
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    print(title)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


# ---- info --------------------------------------------------------------------------------------


def add_info_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "info", help="measure this machine's memory bandwidth and FLOP/s"
    )
    parser.add_argument(
        "--device", help="torch device to measure (default: cuda if present, else cpu)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller (still beyond-cache) working set"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(run=run_info)


def run_info(args) -> int:
    try:
        result = measure(args.device, quick=args.quick)
    except (
        RuntimeError
    ) as error:  # torch's answer to a device it cannot use, e.g. "cuda" on a CPU box
        raise ValueError(
            f"cannot measure device {args.device!r}: {str(error).splitlines()[0]}"
        ) from None
    ridge = {dtype: rate / result.bandwidth for dtype, rate in result.flops.items()}
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "ridge_point": ridge}, indent=2))
        return 0
    rows = [
        ("device", f"{result.device} ({result.device_type})"),
        ("torch", result.torch_version),
        ("threads", str(result.threads)),
        ("memory", human_bytes(result.memory_bytes)),
        (
            "bandwidth",
            f"{si(result.bandwidth, 'B/s')}  (read {si(result.read_bandwidth, 'B/s')}, "
            f"copy {si(result.copy_bandwidth, 'B/s')}, over {human_bytes(result.working_set_bytes)})",
        ),
    ]
    rows += [
        (f"matmul {dtype}", f"{si(rate, 'FLOP/s')}  (ridge point {ridge[dtype]:.3g} FLOPs/byte)")
        for dtype, rate in result.flops.items()
    ]
    print_table("memwall info: the roofline of this machine (best of several runs)", rows)
    return 0


# ---- calc --------------------------------------------------------------------------------------


def add_calc_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "calc",
        help="bytes, FLOPs and the tokens/s ceiling of one decode step",
        description="Roofline arithmetic for decoding one token for each of BATCH sequences of CONTEXT tokens.",
    )
    parser.add_argument("--model", required=True, help=f"one of: {', '.join(MODEL_CATALOG)}")
    parser.add_argument(
        "--hardware",
        required=True,
        help=f"one of: {', '.join(HARDWARE_CATALOG)}, or '{MEASURED_NAME}' to measure this machine",
    )
    parser.add_argument(
        "--dtype", default="bf16", help="weight dtype (default bf16), e.g. fp32, int8, int4, q4_1"
    )
    parser.add_argument("--kv-dtype", help="KV cache dtype (default: the compute dtype)")
    parser.add_argument(
        "--context", type=int, default=1024, help="tokens per sequence (default 1024)"
    )
    parser.add_argument(
        "--batch", type=int, default=1, help="sequences decoded together (default 1)"
    )
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
    if hardware.strip().lower() == MEASURED_NAME:
        hardware = measure(quick=args.quick).as_hardware()
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
                f"(ridge point {r['ridge_point']:.3g}: {r['bound']}-bound)",
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


# ---- wiring ------------------------------------------------------------------------------------


def _plugin_modules(command: str | None) -> list:
    """Import the plugin modules needed: the one that provides `command`, or all of them."""
    if command in PLUGIN_COMMANDS:
        wanted = [PLUGIN_COMMANDS[command]]
    else:  # help, no command, or a typo: list every command there is
        wanted = list(dict.fromkeys(PLUGIN_COMMANDS.values()))
    modules = []
    for name in wanted:
        if importlib.util.find_spec(name) is None:  # not written yet
            continue
        module = importlib.import_module(name)
        if hasattr(module, "register_cli"):
            modules.append(module)
    return modules


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="memwall", description="Why LLM inference is bound by bytes, not FLOPs.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_info_parser(subparsers)
    add_calc_parser(subparsers)
    if command not in ("info", "calc"):
        for module in _plugin_modules(command):
            module.register_cli(subparsers)
    return parser


def _command_in(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(_command_in(argv))
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return args.run(args) or 0
    except (UsageError, ValueError) as error:
        message = str(error) if isinstance(error, UsageError) else f"memwall: error: {error}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exit_:  # --help and --version exit through argparse
        return exit_.code if isinstance(exit_.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
