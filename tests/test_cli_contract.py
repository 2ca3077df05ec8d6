"""The memwall command keeps the README's promises, for every subcommand.

Every `--help` works and shows each default once, in a form a reader can act on (no "(default:
[])", no `.ipynb` solutions: they are `.md`); every command the README says takes `--json` does;
and a table of bad inputs ends each in one line on stderr, exit status 2, no traceback. All of it
runs in-process and stops before any model loads or any measurement starts (serve checks its
port and host before it loads a model).
"""

import argparse
import re
from pathlib import Path

import pytest

from memwall import cli

ROOT = Path(__file__).resolve().parents[1]
# The two commands the README names as having no --json: a server, and a file writer.
NO_JSON = {"serve", "notebooks"}


def needs_every_extra():
    missing = {spec.extra for spec in cli.COMMANDS.values() if cli.missing_modules(spec.extra)}
    if missing:
        pytest.skip(f"needs every extra; not installed: {', '.join(sorted(missing))}")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def every_command_line():
    """[command] and, for `bench`, [bench, benchmark]: each parser a reader can ask for --help."""
    lines = []
    for command in cli.COMMANDS:
        lines.append([command])
        if command == "bench":
            from memwall.bench import SUBCOMMANDS

            lines += [["bench", name] for name in SUBCOMMANDS]
    return lines


def test_every_help_works_and_shows_each_default_once(capsys):
    needs_every_extra()
    for line in [[], *every_command_line()]:
        code, out, err = run(capsys, *line, "--help")
        where = " ".join(["memwall", *line, "--help"])
        assert code == 0 and err == "", f"{where}: exit {code}\n{err}"
        assert out.startswith(f"usage: {' '.join(['memwall', *line])}"), where
        flat = re.sub(r"\s+", " ", out)  # argparse wraps lines anywhere
        assert "(default: [])" not in flat and "(default: None)" not in flat, where
        assert "solutions/*.ipynb" not in flat and "solutions/NN_slug.ipynb" not in flat, where
        # One option's help is the text up to the next option; "default" at most once in it.
        for option_help in re.split(r" (?=-{1,2}[a-z][\w-]*[ ,])", flat.split("options:", 1)[-1]):
            assert option_help.count("default") <= 1, f"{where}: {option_help}"


def test_every_command_but_serve_and_notebooks_takes_json():
    needs_every_extra()
    readme = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
    assert "Every command but `serve`" in readme and "and `notebooks`" in readme
    for line in every_command_line():
        if line == ["bench"]:
            continue  # a group: each benchmark under it is checked
        parser = cli.build_parser(line[0])
        for word in line:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            parser = sub.choices[word]
        options = {o for action in parser._actions for o in action.option_strings}
        assert ("--json" in options) == (line[0] not in NO_JSON), " ".join(line)


BAD_INPUTS = [
    (["frobnicate"], "invalid choice"),
    (["info", "--bogus"], "unrecognized arguments"),
    (["info", "--device", "tpu9"], "choose cpu, cuda"),
    (["calc", "--model", "nope", "--hardware", "h100-sxm"], "llama-3-8b"),
    (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", "-1"], "batch"),
    (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", "x"], "invalid int"),
    (["bench", "nope"], "invalid choice"),
    (["bench", "decode", "--new-tokens", "many"], "invalid int"),
    (["bench", "batch", "--bogus"], "unrecognized arguments"),
    # An option that would change nothing is refused, not ignored.
    (["bench", "decode", "--engine", "hf", "--fast", "on"], "fast applies to memwall"),
    (["bench", "decode", "--quant", "int8", "--group-size", "64"], "add --quant int4"),
    (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--quick"], "--quick applies"),
    (["generate"], "required: prompt"),
    (["generate", "hello", "--max-tokens", "0"], "--max-tokens"),
    (["generate", "hello", "--temperature", "warm"], "invalid float"),
    (["generate", "hello", "--temperature", "nan"], "finite"),
    (["generate", "hello", "--seed", str(2**70)], "seed must lie"),
    (["generate", "caf\udce9"], "not valid UTF-8"),  # the byte 0xe9 as argv holds it
    (
        ["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", str(10**400)],
        "too large",
    ),
    (["serve", "--block-size", "0"], "--block-size"),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--requests", "0"], "--requests"),
    (["serve", "--port", "70000"], "between 1 and 65535"),
    (["serve", "--port", "-1"], "between 1 and 65535"),
    (["serve", "--host", "1.2.3.4"], "not an address of this machine"),
    (["serve", "--max-batch", "0"], "--max-batch"),
    (["serve", "--json"], "unrecognized arguments"),
    (["grade", "/nonexistent/submissions"], "no submissions folder"),
    (["grade", ".", "--jobs", "0"], "jobs"),
    (
        [
            "grade",
            str(ROOT / "book" / "_theme"),
            "--solutions",
            str(ROOT / "solutions"),
            "--out",
            "/nonexistent/grades.csv",
        ],
        "no notebooks to grade",
    ),
    (["exercises", "--check", "--solutions", "/nonexistent"], "no solution notebooks"),
    (["notebooks", "--root", "/nonexistent"], "no chapters/ or solutions/"),
    (["build-kernels", "--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_no_traceback(capsys, argv, message):
    command = cli.COMMANDS.get(argv[0])
    if command and cli.missing_modules(command.extra):
        pytest.skip(f"needs the {command.extra} extra")
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert message in err and err.startswith("memwall"), err
