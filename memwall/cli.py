"""The `memwall` command.

`info` and `calc` live here. Other commands live next to the code they drive and plug in: each
entry of COMMANDS names the module whose `register_cli(subparsers)` adds the command,

    def register_cli(subparsers):
        parser = subparsers.add_parser("bench", help="...")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(run=run_bench)   # run(args) -> exit code (None means 0)

and the extra (`pip install "memwall[engine]"`) that the command needs. `memwall --help` lists
every command from this table without importing any of them, so it works in a lean install with
no torch; a plugin module is imported only when its command runs. A `ValueError` raised by any
command becomes a one-line error and exit code 2, and so does a missing extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys

from memwall import __version__, cost
from memwall.hardware import CATALOG as HARDWARE_CATALOG
from memwall.hardware import MEASURED_NAME, get_hardware, measure
from memwall.specs import CATALOG as MODEL_CATALOG
from memwall.units import human_bytes, parameter_count, print_table, seconds, si

EXIT_USAGE = 2

# What each extra brings that a command imports: the modules checked before a command runs.
# tests/test_lean_package.py checks that each is declared in that extra in pyproject.toml.
EXTRA_MODULES = {
    "engine": ("torch", "numpy", "transformers", "safetensors"),
    "grade": ("numpy", "nbformat", "nbclient", "jupytext"),
    "book": ("nbformat", "jupytext"),
}


@dataclasses.dataclass(frozen=True)
class Command:
    module: str | None  # the module whose register_cli adds it; None for info and calc (here)
    extra: str | None  # the extra it needs; None: the core install is enough
    help: str


COMMANDS = {
    "info": Command(None, "engine", "measure this machine's bandwidth and FLOP/s"),
    "calc": Command(None, None, "bytes, FLOPs and the tokens/s ceiling of one decode step"),
    "bench": Command("memwall.bench", "engine", "measure decode, batching and servers"),
    "generate": Command("memwall.engine.cli", "engine", "generate text and time it"),
    "serve": Command("memwall.serving.cli", "engine", "an OpenAI-compatible server"),
    "grade": Command("memwall.grading", "grade", "grade a folder of submitted notebooks"),
    "exercises": Command("memwall.grading", "grade", "write or check exercises/ from solutions/"),
    "notebooks": Command("memwall.notebooks", "book", "write the launch notebooks (.ipynb)"),
    "build-kernels": Command("memwall.engine.cpu.cli", "engine", "compile C kernels ahead of time"),
}


class UsageError(Exception):
    """Bad command-line input, or a missing extra; main() prints it on one line."""


class _HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help, unless the help already speaks of it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or any(action.default is x for x in (None, False, argparse.SUPPRESS)):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    # Subcommand parsers are made with this class too, so every command gets the formatter.
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    # argparse would print the usage block and call sys.exit; one clear line is friendlier.
    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message}")


def missing_modules(extra: str | None) -> list[str]:
    """The modules of `extra` that are not installed (none for the core)."""
    return [m for m in EXTRA_MODULES.get(extra, ()) if importlib.util.find_spec(m) is None]


def require_extra(extra: str | None, what: str) -> None:
    """A one-line UsageError naming the pip command, when `extra` is not installed."""
    missing = missing_modules(extra)
    if missing:
        raise UsageError(
            f"memwall: {what} needs the {extra} extra ({', '.join(missing)} not installed): "
            f'pip install "memwall[{extra}]"'
        )


# ---- info --------------------------------------------------------------------------------------


def add_info_parser(subparsers) -> None:
    parser = subparsers.add_parser("info", help=_listed_help(COMMANDS["info"]))
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

    if name is None:
        return None
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
    try:
        result = measure(device, quick=args.quick)
    except (RuntimeError, AssertionError) as error:  # torch's answer to a device it cannot use
        first_line = (str(error).splitlines() or [type(error).__name__])[0]
        raise ValueError(f"cannot measure device {args.device!r}: {first_line}") from None
    ridge = {dtype: cost.ridge_point(result.as_hardware(), dtype) for dtype in result.flops}
    kernels = result.device_type == "cpu"  # memwall's CPU kernels and the path chosen per format
    if args.json:
        record = {**dataclasses.asdict(result), "ridge_point": ridge}
        if kernels:
            from memwall.engine.cpu import chosen_paths

            record["kernels"] = chosen_paths()
        print(json.dumps(record, indent=2))
        return 0
    rows = [
        ("device", f"{result.device} ({result.device_type})"),
        ("torch", result.torch_version),
        ("threads", str(result.threads)),
        ("memory", human_bytes(result.memory_bytes)),
        (
            "bandwidth",
            f"{si(result.bandwidth, 'B/s')}  (read {si(result.read_bandwidth, 'B/s')}, "
            f"copy {si(result.copy_bandwidth, 'B/s')}, "
            f"over {human_bytes(result.working_set_bytes)})",
        ),
    ]
    rows += [
        (f"matmul {dtype}", f"{si(rate, 'FLOP/s')}  (ridge point {ridge[dtype]:.3g} FLOPs/byte)")
        for dtype, rate in result.flops.items()
    ]
    if kernels:
        from memwall.engine.cpu import info_rows

        rows += info_rows()
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
    if hardware.strip().lower() == MEASURED_NAME:
        require_extra("engine", f"--hardware {MEASURED_NAME} (measuring this machine)")
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


# ---- wiring ------------------------------------------------------------------------------------


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for `command`; for any other word (or none) a parser that lists every command.

    Only the module of `command` is imported, and only after its extra is checked, so neither
    `memwall --help` nor `memwall calc` needs torch.
    """
    parser = _Parser(
        prog="memwall",
        description="Why LLM inference is bound by bytes, not FLOPs.",
        formatter_class=lambda prog: _HelpFormatter(prog, max_help_position=22),  # long names
    )
    parser.add_argument("--version", action="version", version=f"memwall {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command in COMMANDS and COMMANDS[command].module is not None:
        spec = COMMANDS[command]
        require_extra(spec.extra, f"`memwall {command}`")
        importlib.import_module(spec.module).register_cli(subparsers)
        return parser
    for name, spec in COMMANDS.items():
        if name == "info":
            add_info_parser(subparsers)
        elif name == "calc":
            add_calc_parser(subparsers)
        else:  # listed, not imported: a placeholder that only carries the help line
            subparsers.add_parser(name, help=_listed_help(spec))
    return parser


def _listed_help(spec: Command) -> str:
    if spec.extra is None:
        return spec.help
    installed = "" if not missing_modules(spec.extra) else ", not installed"
    return f"{spec.help} [memwall[{spec.extra}]{installed}]"


def _command_in(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _silence_broken_pipe() -> int:
    """`memwall calc | head -1`: the reader left; say nothing (the recipe in Python's docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the final flush at exit cannot fail again
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        command = _command_in(argv)
        parser = build_parser(command)
        args = parser.parse_args(argv)
        if getattr(args, "run", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        if args.command == "info":
            require_extra(COMMANDS["info"].extra, "`memwall info`")
        code = args.run(args) or 0
        sys.stdout.flush()  # a closed pipe shows up here, inside the handler below
        return code
    except BrokenPipeError:
        return _silence_broken_pipe()
    except (UsageError, ValueError) as error:
        message = str(error) if isinstance(error, UsageError) else f"memwall: error: {error}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exit_:  # --help and --version exit through argparse
        return exit_.code if isinstance(exit_.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
