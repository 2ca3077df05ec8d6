"""The grader's own side, without kernels: the channel, plain values, defensive reads and writes,
submission discovery, CSV escaping, and the checks made before any grading starts."""

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest

from memwall.exercise_driver import driver
from memwall.exercise_driver.values import NotPlain, build_spec, from_plain, to_plain
from memwall.grading import grade
from memwall.grading.channel import GraderChannel
from memwall.grading.execute import read_records
from memwall.grading.grader import GradeRow, check_ready
from memwall.grading.registry import get_check
from memwall.grading.report import ReportWriter, safe_cell, write_csv
from memwall.grading.safe_files import UnsafeFile, read_regular, write_atomically
from memwall.grading.sandbox import bwrap_path
from memwall.grading.serve_cells import UNCONVERTIBLE, serve_source
from memwall.grading.submissions import REFUSED_LINK, find_submissions
from memwall.grading.tampering import tampering_flags

SOLUTIONS = Path(__file__).parent / "fixtures" / "grading" / "solutions"


# ---- the channel, with serve() in a thread standing in for the student's kernel --------------


def served(tmp_path, monkeypatch, answers: dict, call_seconds=5.0):
    """Verdicts after serve(name, answer) ran for each item of ``answers``."""
    socket_path = tmp_path / "grader.sock"
    monkeypatch.setenv(driver.CHANNEL_VARIABLE, str(socket_path))
    checks = {name: get_check(name) for name in answers}
    with GraderChannel(socket_path, checks, call_seconds) as channel:
        for name, answer in answers.items():
            worker = threading.Thread(target=driver.serve, args=(name, answer), daemon=True)
            worker.start()
            worker.join(call_seconds * 3)
    return channel.verdicts


def test_the_grader_judges_a_served_function_itself(tmp_path, monkeypatch):
    def matrix_bytes(rows, cols, bytes_per_element):
        return rows * cols * bytes_per_element

    def matmul_intensity(m, n, k, bytes_per_element):
        return m * n * k  # wrong

    verdicts = served(
        tmp_path,
        monkeypatch,
        {"demo.matrix_bytes": matrix_bytes, "demo.matmul_intensity": matmul_intensity},
    )
    assert verdicts["demo.matrix_bytes"].passed
    assert verdicts["demo.matrix_bytes"].message == "12/12 cases passed"
    assert not verdicts["demo.matmul_intensity"].passed
    assert "wrong answer for matmul_intensity(m=" in verdicts["demo.matmul_intensity"].message


def test_a_measured_case_stays_in_the_grader(tmp_path, monkeypatch):
    """The student's function gets a stand-in for the workload: its methods run in the grader,
    and the true step times (private attributes) are not in the student's process to read."""
    from memwall.grading.answer_key import key_module

    reference_mean_step_s = key_module("demo").reference_mean_step_s

    seen = []

    def mean_step_s(workload):
        seen.append((type(workload).__name__, hasattr(workload, "_step_times_s")))
        return reference_mean_step_s(workload)

    def reads_the_truth(workload):
        times = workload._step_times_s  # the fake clock's answer, were it here
        return sum(times) / len(times)

    verdicts = served(tmp_path, monkeypatch, {"demo.mean_step_s": mean_step_s})
    assert verdicts["demo.mean_step_s"].passed
    assert seen and set(seen) == {("GraderObject", False)}
    (tmp_path / "again").mkdir()
    verdicts = served(tmp_path / "again", monkeypatch, {"demo.mean_step_s": reads_the_truth})
    assert not verdicts["demo.mean_step_s"].passed
    assert "AttributeError" in verdicts["demo.mean_step_s"].message


def _cache_cliff_from_the_truth(bench, sizes, repeats):
    return max(size for size in sizes if size <= bench._cache_bytes)


def _slowdown_from_the_truth(bench, repeats):
    return bench._b_s / bench._a_s


@pytest.mark.parametrize(
    "name, cheat",
    [
        ("ch03.cache_cliff", _cache_cliff_from_the_truth),
        ("ch09.ab_slowdown", _slowdown_from_the_truth),
    ],
)
def test_a_measured_exercise_cannot_read_its_benchs_truth(tmp_path, monkeypatch, name, cheat):
    """Returning the bench's private true numbers scores nothing under the grader, though the
    same function passes where the bench is built in its own process (the notebook's check)."""
    from memwall.grading.checking import run_check

    assert run_check(get_check(name), cheat, random.Random(1)).passed
    verdicts = served(tmp_path, monkeypatch, {name: cheat})
    assert not verdicts[name].passed
    assert "AttributeError" in verdicts[name].message


def test_the_grader_runs_only_public_calls_on_a_served_bench():
    from memwall.exercise_driver.values import remote_handle
    from memwall.fakeclock import build
    from memwall.grading.channel import invoke

    def arguments(*args):  # what the student's stand-in sends
        return to_plain([list(args), {}])

    bench = build("formats", {"seconds_by_format": {"fp32": 0.01}})
    served = [(bench, remote_handle(0, bench))]
    assert invoke(served, [0, "clock", arguments()]) == {"result": 0.0}
    assert invoke(served, [0, "matvec", arguments("fp32")]) == {"result": None}
    assert invoke(served, [0, "clock", arguments()])["result"] == pytest.approx(0.01)
    refused = [
        [0, "_seconds", None],  # private data
        [0, "_machine", arguments()],
        [0, "__class__", None],
        [-1, "clock", arguments()],  # not a served object
        [1, "clock", arguments()],
        [True, "clock", arguments()],
        [0, "matvec", None],  # a method read as a property
        "nonsense",
    ]
    for request in refused:
        assert "error" in invoke(served, request), request
    kind, message = invoke(served, [0, "matvec", arguments("int3")])["error"]
    assert kind == "ValueError" and "unknown format" in message  # the bench's own refusal


def test_one_slow_call_times_out_and_scores_nothing(tmp_path, monkeypatch):
    def matrix_bytes(rows, cols, bytes_per_element):
        time.sleep(2)
        return rows * cols * bytes_per_element

    verdicts = served(tmp_path, monkeypatch, {"demo.matrix_bytes": matrix_bytes}, call_seconds=0.3)
    assert not verdicts["demo.matrix_bytes"].passed
    assert "timed out" in verdicts["demo.matrix_bytes"].message


def test_unknown_checks_and_second_sessions_get_no_verdict(tmp_path, monkeypatch):
    socket_path = tmp_path / "grader.sock"
    monkeypatch.setenv(driver.CHANNEL_VARIABLE, str(socket_path))
    checks = {"demo.matrix_bytes": get_check("demo.matrix_bytes")}
    with GraderChannel(socket_path, checks, 5.0) as channel:
        driver.serve("demo.not_a_check", lambda: 1)
        driver.serve("demo.matrix_bytes", lambda rows, cols, bytes_per_element: 0)
        driver.serve("demo.matrix_bytes", lambda rows, cols, bytes_per_element: 1)  # too late
    assert set(channel.verdicts) == {"demo.matrix_bytes"}
    assert "expected" in channel.verdicts["demo.matrix_bytes"].message


def test_a_students_exception_keeps_its_builtin_type():
    from memwall.grading.channel import remote_exception

    assert isinstance(remote_exception("ValueError", "bad"), ValueError)
    assert not isinstance(remote_exception("KeyboardInterrupt", "x"), KeyboardInterrupt)
    assert type(remote_exception("MyError", "x")).__name__ == "MyError"
    assert type(remote_exception("not a name", "x")).__name__ == "Exception"


# ---- plain values -----------------------------------------------------------------------------


def test_plain_values_round_trip():
    import torch

    value = {
        1: (2.5, [True, None, "x"]),
        "a": np.arange(6, dtype=np.int16).reshape(2, 3),
        "t": torch.ones(2, 2, dtype=torch.bfloat16),
    }
    back = from_plain(to_plain(value))
    assert back[1] == (2.5, [True, None, "x"])
    assert back["a"].dtype == np.int16 and back["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["t"].dtype == torch.bfloat16 and back["t"].shape == (2, 2)


def test_results_cannot_smuggle_objects():
    with pytest.raises(NotPlain):
        to_plain(object())
    with pytest.raises(NotPlain):
        to_plain(lambda: 1)
    spec = build_spec("fake_clock_workload", step_times_s=[0.1])
    with pytest.raises(NotPlain):  # a result may not ask the grader to build anything
        from_plain(spec)
    assert type(from_plain(spec, allow_build=True)).__name__ == "FakeClockWorkload"
    with pytest.raises(NotPlain):
        from_plain({"__memwall__": "pickle", "data": "..."})
    nested = []
    for _ in range(100):
        nested = [nested]
    with pytest.raises(NotPlain):
        to_plain(nested)


# ---- reading and writing defensively ----------------------------------------------------------


def test_reads_refuse_links_fifos_folders_and_big_files(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("0123456789")
    assert read_regular(real, 100) == b"0123456789"
    assert read_regular(real, 4, tail=True) == b"6789"
    with pytest.raises(UnsafeFile):
        read_regular(real, 4)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeFile):
        read_regular(tmp_path / "link", 100)
    os.mkfifo(tmp_path / "fifo")  # nobody writes to it: a blocking open would hang the test
    with pytest.raises(UnsafeFile):
        read_regular(tmp_path / "fifo", 100)
    with pytest.raises(UnsafeFile):
        read_regular(tmp_path, 100)
    records, why = read_records(tmp_path / "fifo")
    assert records == [] and "not a regular file" in why


def test_atomic_writes_refuse_a_folder_or_a_link_at_the_target(tmp_path):
    write_atomically(tmp_path / "a.csv", "one")
    write_atomically(tmp_path / "a.csv", "two")
    assert (tmp_path / "a.csv").read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["a.csv"]  # no temporary file left
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        write_atomically(tmp_path / "dir.csv", "x")
    (tmp_path / "link.csv").symlink_to(tmp_path / "a.csv")
    with pytest.raises(ValueError):
        write_atomically(tmp_path / "link.csv", "x")
    assert (tmp_path / "a.csv").read_text() == "two"


def test_grading_refuses_a_folder_where_the_csv_goes_before_running_anything(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "ann__00_demo.ipynb").write_text("{}")
    (tmp_path / "grades.csv").mkdir()
    with pytest.raises(ValueError, match="is not a file"):
        grade(tmp_path / "subs", tmp_path / "grades.csv", solutions_dir=SOLUTIONS, progress=False)


# ---- submissions -------------------------------------------------------------------------------


def test_links_are_refused_and_fifos_skipped(tmp_path):
    outside = tmp_path / "outside.ipynb"
    outside.write_text("{}")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "mallory__00_demo.ipynb").symlink_to(outside)
    (subs / "trudy").symlink_to(tmp_path)
    os.mkfifo(subs / "fifo__00_demo.ipynb")
    found, skipped = find_submissions(subs)
    assert {(s.student, s.problem) for s in found} == {
        ("mallory", REFUSED_LINK),
        ("trudy", REFUSED_LINK),
    }
    assert [p.name for p in skipped] == ["fifo__00_demo.ipynb"]


def test_names_are_nfc_and_duplicates_are_not_graded(tmp_path):
    (tmp_path / "Jose\u0301__00_demo.ipynb").write_text("{}")
    (tmp_path / "Jos\u00e9").mkdir()
    (tmp_path / "Jos\u00e9" / "00_demo.ipynb").write_text("{}")
    (tmp_path / "ann__00_demo.ipynb").write_text("{}")
    found, _ = find_submissions(tmp_path)
    by_student = [(s.student, s.problem.split(":")[0]) for s in found]
    assert by_student == [("Jos\u00e9", "duplicate"), ("Jos\u00e9", "duplicate"), ("ann", "")]
    # each duplicate names its own file: the CSV's columns cannot tell the two apart
    assert {s.problem for s in found if s.problem} == {
        "duplicate: Jos\u00e9/00_demo.ipynb and 1 other file for this student and chapter",
        "duplicate: Jos\u00e9__00_demo.ipynb and 1 other file for this student and chapter",
    }


def test_csv_cells_that_look_like_formulas_are_escaped(tmp_path):
    assert safe_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert [safe_cell(s) for s in ("+1", "-1", "@x", "\tx", "ok")] == [
        "'+1",
        "'-1",
        "'@x",
        " x",
        "ok",
    ]
    write_csv(
        [GradeRow("=cmd|' /C calc'!A0", "00_demo.ipynb", "00_demo", status="-oops")],
        tmp_path / "g.csv",
    )
    text = (tmp_path / "g.csv").read_text()
    assert "'=cmd" in text and "'-oops" in text


def test_duplicate_feedback_names_do_not_overwrite_each_other(tmp_path):
    writer = ReportWriter(tmp_path / "g.csv", tmp_path / "feedback")
    for status in ("first", "second"):
        row = GradeRow("ann", "00_demo.ipynb", "00_demo", status=status)
        row.feedback_name = "ann__00_demo.txt"
        writer.add(row)
    assert sorted(p.name for p in (tmp_path / "feedback").iterdir()) == [
        "ann__00_demo-2.txt",
        "ann__00_demo.txt",
    ]


def test_a_rerun_keeps_the_earlier_results_under_numbered_names(tmp_path):
    for run in ("first", "second", "third"):
        writer = ReportWriter(tmp_path / "g.csv", tmp_path / "feedback")
        row = GradeRow(run, "00_demo.ipynb", "00_demo", status="ok")
        row.feedback_name = f"{run}__00_demo.txt"
        writer.add(row)
        writer.finish()
    assert "first" in (tmp_path / "g.csv.~1~").read_text()
    assert "second" in (tmp_path / "g.csv.~2~").read_text()
    assert "third" in (tmp_path / "g.csv").read_text()
    assert (tmp_path / "g.summary.md.~1~").is_file()
    assert [p.name for p in (tmp_path / "feedback.~1~").iterdir()] == ["first__00_demo.txt"]
    assert [p.name for p in (tmp_path / "feedback").iterdir()] == ["third__00_demo.txt"]


def test_a_renamed_copy_is_graded_as_the_chapter_it_was_made_from(tmp_path):
    copy = nbformat.v4.new_notebook(metadata={"memwall": {"generated_from": "03_memory_wall.md"}})
    copy.cells.append(nbformat.v4.new_code_cell("x = 1"))
    for name in ("ann__03_memory_wall (1).ipynb", "bob/Copy of 03_memory_wall.IPYNB",
                 "03_memory_wall (1).ipynb"):  # fmt: skip
        (tmp_path / name).parent.mkdir(exist_ok=True)
        nbformat.write(copy, tmp_path / name)
    found, skipped = find_submissions(tmp_path, chapters={"03_memory_wall"})
    assert not skipped
    assert [(s.student, s.chapter, s.renamed) for s in found] == [
        ("03_memory_wall (1)", "", False),  # no student part: whose it is cannot be guessed
        ("ann", "03_memory_wall", True),
        ("bob", "03_memory_wall", True),
    ]
    found, _ = find_submissions(tmp_path)  # without the solutions' names, nothing is read
    assert [s.chapter for s in found] == ["", "03_memory_wall (1)", "Copy of 03_memory_wall"]


# ---- before grading ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout, cell_timeout, jobs, call_timeout",
    [(-1, 10, 1, None), (0, 10, 1, None), (10, -5, 1, None), (10, 10, 0, None), (10, 10, True, None),
     (10, 10, 1, 0)],
)  # fmt: skip
def test_nonsense_limits_are_refused(timeout, cell_timeout, jobs, call_timeout):
    with pytest.raises(ValueError):
        check_ready(timeout, cell_timeout, jobs, call_timeout)


def test_missing_grading_tools_fail_with_an_install_hint(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nbval" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"nbval.*pip install 'memwall\[grade\]'"):
        check_ready(10, 10, 1)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "memwall.grading", "grade", *map(str, args)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_cli_rejects_a_negative_timeout_in_one_line(tmp_path):
    (tmp_path / "subs").mkdir()
    result = run_cli(tmp_path / "subs", "--timeout", "-1", "--solutions", SOLUTIONS)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: the timeout must be a positive number")
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_exits_nonzero_when_a_notebook_could_not_be_graded(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "ann__00_demo.ipynb").write_text("{}")
    (subs / "ann").mkdir()
    (subs / "ann" / "00_demo.ipynb").write_text("{}")
    result = run_cli(subs, "--out", tmp_path / "g.csv", "--solutions", SOLUTIONS, "--json")
    assert result.returncode == 1, result.stderr
    assert "could not grade ann" in result.stderr
    assert (tmp_path / "g.csv").read_text().count("duplicate") == 2


# ---- the rest ----------------------------------------------------------------------------------


def test_check_cells_become_serve_cells():
    assert serve_source('from memwall.grading import check\ncheck("demo.x", my_fn)', "demo.x") == (
        'from memwall.exercise_driver.driver import serve\nserve("demo.x", my_fn)\n'
    )
    assert serve_source("check(", "demo.x") == UNCONVERTIBLE
    assert serve_source('check("demo.y", f)', "demo.x") == UNCONVERTIBLE


def test_the_tampering_scan_is_linear_on_pathological_code():
    # Each of these took quadratic time with the old regular expressions.
    nasty = [
        "from memwall import " * 50_000,
        "\n" * 200_000 + "x",
        " " * 200_000 + "check",
        "exec " * 50_000,
    ]
    assert tampering_flags(nasty) == []
    assert tampering_flags(["get_ipython().set_custom_exc((E,), f)"]) == ["uses IPython hooks"]
    assert tampering_flags(["return reference_decode_ceiling(x)"]) == ["calls a reference"]
    assert tampering_flags(["reference_time = 3", "my_reference_(1)"]) == []


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) cannot run here")
def test_a_sandbox_that_cannot_run_notebooks_stops_grading_before_it_starts(tmp_path, monkeypatch):
    from memwall.grading import sandbox

    (tmp_path / "subs").mkdir()
    monkeypatch.setattr(sandbox, "PREFLIGHT", "import memwall.grading")  # hidden in the sandbox
    with pytest.raises(ValueError, match="sandboxed Python cannot run the notebooks"):
        grade(tmp_path / "subs", tmp_path / "g.csv", solutions_dir=SOLUTIONS, progress=False)
    assert not (tmp_path / "g.csv").exists()


class _Cycle:
    """Garbage only the cyclic collector frees, so collections (and thread switches) happen
    while a syntax tree is being built."""

    def __init__(self):
        self.me = self

    def __del__(self):
        pass


def test_grader_threads_can_fingerprint_code_at_the_same_time():
    """The grader's pool fingerprints two submissions at once (CPython 3.11's parser shares one
    recursion counter between threads; without the grader's lock this fails within 100 rounds)."""
    from memwall.grading.copied import fingerprints

    body = "".join(
        f"    x{i} = [[a, {{'k': (a + {i}) * 2}}] for _ in range(3)]\n" for i in range(40)
    )
    source = f"def f(a):\n{body}    return a\n"
    errors = []

    def fingerprint_many():
        try:
            for _ in range(100):
                _Cycle()
                assert fingerprints(source)
        except Exception as error:  # noqa: BLE001 - collected and reported below
            errors.append(error)

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to meet the race
    try:
        workers = [threading.Thread(target=fingerprint_many) for _ in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(switch_interval)
    assert errors == []
