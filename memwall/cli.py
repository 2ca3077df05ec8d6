"""The `memwall` command.

Every command lives next to the code it drives (`info` and `calc` in memwall/roofline_cli.py) and
plugs in: each entry of COMMANDS names the module whose `register_cli(subparsers)` adds it,

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
import errno
import importlib
import importlib.util
import os
import sys

from memwall import __version__

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
    module: str  # the module whose register_cli(subparsers) adds it
    extra: str | None  # the extra it needs; None: the core install is enough
    help: str


COMMANDS = {
    "info": Command(
        "memwall.roofline_cli", "engine", "measure this machine's bandwidth and FLOP/s"
    ),
    "calc": Command(
        "memwall.roofline_cli", None, "bytes, FLOPs and the tokens/s ceiling of one decode step"
    ),
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
    """Gives each option's default once: "(default: X)", unless the help already speaks of it.

    A help that states its default bare, "(8192)", gets the word instead of a second copy; a
    default that means "nothing" (None, False, an empty list) is not shown.
    """

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default is argparse.SUPPRESS
        if "default" in text or nothing or (isinstance(default, (list, tuple)) and not default):
            return text
        spellings = [default]
        if isinstance(default, float) and default.is_integer():
            spellings.append(int(default))  # "(30)" for 30.0
        for value in spellings:
            if f"({value})" in text:
                return text.replace(f"({value})", f"(default: {value})", 1)
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
    if command in COMMANDS:
        spec = COMMANDS[command]
        require_extra(spec.extra, f"`memwall {command}`")
        importlib.import_module(spec.module).register_cli(subparsers)
        return parser
    for name, spec in COMMANDS.items():  # listed, not imported: placeholders with the help line
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
        code = args.run(args) or 0
        if sys.stdout is not None:  # (None when the shell closed it: `memwall calc >&-`)
            sys.stdout.flush()  # a closed pipe or a full disk shows up here, inside the handlers
        return code
    except BrokenPipeError:
        return _silence_broken_pipe()
    except KeyboardInterrupt:
        print("memwall: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it
    except OSError as error:  # a file or a device refused: a full disk, a missing folder, ...
        print(f"memwall: error: {error}", file=sys.stderr)
        if sys.stdout is not None and error.errno == errno.ENOSPC:
            _silence_broken_pipe()  # the exit's own flush would fail on the same disk
        return 1
    except OverflowError as error:  # e.g. `calc --batch 1e400`: a number past a float's range
        print(f"memwall: error: a number is too large: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (UsageError, ValueError) as error:
        message = str(error) if isinstance(error, UsageError) else f"memwall: error: {error}"
        print(message, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exit_:  # --help and --version exit through argparse
        return exit_.code if isinstance(exit_.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
