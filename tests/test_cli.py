"""The memwall command: info, calc, errors, and the plugin hook other commands use."""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memwall import cli, cost

CALC = [
    "calc",
    "--model",
    "llama-3-8b",
    "--hardware",
    "h100-sxm",
    "--dtype",
    "bf16",
    "--context",
    "8192",
    "--batch",
    "16",
]


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_calc_json_matches_the_cost_model(capsys):
    code, out, err = run(capsys, *CALC, "--json")
    assert code == 0 and err == ""
    result = json.loads(out)
    assert result == json.loads(json.dumps(cost.calc("llama-3-8b", "h100-sxm", "bf16", 8192, 16)))
    assert result["weight_bytes"] == pytest.approx(16.06e9, rel=1e-3)
    assert result["kv_bytes_per_token"] == 128 * 1024
    assert result["kv_bytes_total"] == 16 * 2**30
    assert result["fits"] is True and result["max_users"] == 59
    assert result["step_time_s"] == pytest.approx(result["bytes_per_step"] / 3.35e12)


def test_calc_options_reach_the_cost_model(capsys):
    code, out, _ = run(
        capsys,
        "calc",
        "--model",
        "llama-3-8b",
        "--hardware",
        "l4",
        "--dtype",
        "int4",
        "--kv-dtype",
        "int8",
        "--kv-heads",
        "1",
        "--context",
        "100",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert (result["dtype"], result["kv_dtype"], result["n_kv_heads"]) == ("int4", "int8", 1)
    assert result["kv_bytes_per_token"] == 2 * 32 * 1 * 128 * 1
    assert result == json.loads(
        json.dumps(cost.calc("llama-3-8b", "l4", "int4", 100, 1, "int8", 1))
    )


def test_calc_table_is_readable(capsys):
    code, out, _ = run(capsys, *CALC)
    assert code == 0
    assert "16.06 GB (14.96 GiB)" in out  # weights
    assert "128 KiB" in out  # KV per token
    assert "16 GiB" in out  # KV for the batch
    assert "9.95 ms" in out and "1,608.6 in total" in out
    assert "fits" in out and "NOT" not in out
    assert "ridge point 295" in out


def test_calc_says_when_weights_do_not_fit(capsys):
    code, out, _ = run(capsys, "calc", "--model", "llama-3-70b", "--hardware", "l4")
    assert code == 0 and "does NOT fit" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["calc", "--model", "llama-9", "--hardware", "h100-sxm"], "llama-3-8b"),
        (["calc", "--model", "llama-3-8b", "--hardware", "tpu"], "h100-sxm"),
        (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", "9000"], "8192"),
        (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", "-5"], "context"),
        (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--batch", "0"], "batch"),
        (["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--dtype", "fp64"], "bf16"),
        (
            ["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--kv-heads", "3"],
            "multiple",
        ),
        (
            ["calc", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", "lots"],
            "invalid int",
        ),
        (["calc", "--model", "llama-3-8b"], "--hardware"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_no_command_prints_help_and_exits_2(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "info" in err and "calc" in err


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "calc" in out


def test_info_json(capsys):
    code, out, _ = run(capsys, "info", "--quick", "--json")
    assert code == 0
    result = json.loads(out)
    for key in ("device", "device_type", "torch_version", "threads", "bandwidth", "flops"):
        assert key in result
    assert result["bandwidth"] > 1e9 and result["flops"]["fp32"] > 1e9
    assert result["ridge_point"]["fp32"] == pytest.approx(
        result["flops"]["fp32"] / result["bandwidth"]
    )


def test_info_table(capsys):
    code, out, err = run(capsys, "info", "--quick")
    assert code == 0
    # The first line comes before the seconds of measuring, on stderr (stdout stays the table).
    assert err.startswith("memwall info: measuring ")
    assert "bandwidth" in out and "GB/s" in out and "FLOP/s" in out and "threads" in out


def test_calc_on_this_machine(capsys):
    code, out, _ = run(
        capsys,
        "calc",
        "--model",
        "smollm2-135m",
        "--hardware",
        "this",
        "--quick",
        "--dtype",
        "fp32",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert result["hardware"].startswith("this-") and result["weight_bytes"] == 538_060_032


def test_plugin_commands_register_themselves(capsys, monkeypatch, tmp_path):
    (tmp_path / "memwall_test_plugin.py").write_text(
        textwrap.dedent("""
        def register_cli(subparsers):
            parser = subparsers.add_parser("hello", help="say hello")
            parser.add_argument("--name", default="world", help="who to greet")
            parser.set_defaults(run=lambda args: print("hello", args.name))
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "hello", cli.Command("memwall_test_plugin", None, "greet"))
    assert run(capsys, "hello", "--name", "memwall")[:2] == (0, "hello memwall\n")
    assert "greet" in run(capsys, "--help")[1]
    assert "(default: world)" in run(capsys, "hello", "--help")[1]


def test_help_lists_every_command_without_importing_plugins(capsys, monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "later", cli.Command("memwall_not_written", "engine", "x"))
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name in cli.COMMANDS:
        assert name in out
    assert "[memwall[engine]" in out and "[memwall[grade]" in out


def test_a_missing_extra_is_one_line_naming_pip(capsys, monkeypatch):
    monkeypatch.setitem(cli.EXTRA_MODULES, "engine", ("torch", "memwall_no_such_module"))
    for argv in (["bench", "decode"], ["generate", "hi"], ["info"], ["bench", "--help"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert err.strip() == (
            f"memwall: `memwall {argv[0]}` needs the engine extra (memwall_no_such_module not "
            'installed): pip install "memwall[engine]"'
        )
    assert run(capsys, *CALC, "--json")[0] == 0  # the core needs no extra
    code, _, err = run(capsys, "calc", "--model", "gpt2", "--hardware", "this")
    assert code == 2 and 'pip install "memwall[engine]"' in err


def test_version(capsys):
    from memwall import __version__

    assert run(capsys, "--version")[:2] == (0, f"memwall {__version__}\n")


def test_info_on_a_device_torch_cannot_use_is_one_line(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device, message in (("cuda", "not available"), ("tpu9", "choose cpu, cuda")):
        code, out, err = run(capsys, "info", "--device", device)
        assert code == 2 and out == "" and message in err
        assert len(err.strip().splitlines()) == 1


def test_a_closed_pipe_is_silent():
    """`memwall calc | head -1`: the reader is gone before memwall writes; no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "memwall.cli", *CALC],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 1


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _all_parsers(sub)


def test_every_option_has_help_and_shows_its_default():
    """Each command's parser, as `memwall COMMAND --help` builds it (needs every extra)."""
    missing = {spec.extra for spec in cli.COMMANDS.values() if cli.missing_modules(spec.extra)}
    if missing:
        pytest.skip(f"needs every extra; not installed: {', '.join(sorted(missing))}")
    for command in cli.COMMANDS:
        for parser in _all_parsers(cli.build_parser(command)):
            formatter = parser._get_formatter()
            for action in parser._actions:
                if action.help == argparse.SUPPRESS or isinstance(
                    action, argparse._SubParsersAction
                ):
                    continue
                where = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
                assert action.help, f"{where} has no help text"
                shown = formatter._get_help_string(action) % {"default": action.default}
                nothing = action.default in (None, False, argparse.SUPPRESS, [], ())
                if not nothing and action.option_strings:
                    assert "default" in shown, f"{where}: help does not give the default"
                # Once: "(8192) (default: 8192)" says it twice.
                assert shown.count("default") <= 1, f"{where}: {shown}"


def test_console_script():
    script = Path(sys.executable).with_name("memwall")
    if not script.exists():
        pytest.skip("memwall console script not installed next to this Python")
    done = subprocess.run(
        [str(script), *CALC, "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["max_users"] == 59
    bad = subprocess.run(
        [str(script), "calc", "--model", "nope", "--hardware", "h100-sxm"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("memwall: error:")
        and "Traceback" not in bad.stderr
    )


def test_serve_on_a_port_in_use_is_one_line(capsys):
    """Checked before the model loads, so this needs neither the model nor time."""
    pytest.importorskip("torch")
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(capsys, "serve", "--port", str(port))
    assert code == 2 and out == ""
    assert f"127.0.0.1:{port}" in err and "--port" in err and len(err.strip().splitlines()) == 1


def test_exercises_check_with_no_solutions_is_an_error(capsys, tmp_path):
    if cli.missing_modules("grade"):
        pytest.skip("needs the grade extra")
    for folder in ("nope", str(tmp_path)):  # missing, and present but empty
        code, out, err = run(capsys, "exercises", "--check", "--solutions", folder)
        assert code == 2 and "in sync" not in out
        assert "no solution notebooks" in err and len(err.strip().splitlines()) == 1
