"""The attacks of issue 17 as regression tests: each scores 0 and harms nobody else.

One batch (module fixture, two jobs, sandboxed) grades an honest student next to notebooks that
delegate to the references, swallow the check's error, rewrite the check cells, swap the check
lookup, pin the hidden cases, vandalise other files, leave a daemon behind, forge results, leak
through their feedback and try to stop the grader. Every attacker scores 0; the honest row, the
submissions, the solutions, the installed package and the CSV stay as they should.
"""

import hashlib
import os
import random
import secrets
import sysconfig
import time
from pathlib import Path

import nbformat
import pytest

import memwall
from memwall.grading import check, grade
from memwall.grading.registry import get_check
from memwall.grading.report import FEEDBACK_MAX_CHARACTERS
from memwall.grading.sandbox import Limits, bwrap_path
from memwall.notebooks import student_copy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) cannot run here"),
]

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
CHAPTER = "00_demo"
TOKEN = f"pwned{secrets.token_hex(6)}"
SECRET = f"instructor-secret-{secrets.token_hex(6)}"
VICTIM_MARK = f"victim-only-{secrets.token_hex(6)}"
PACKAGE = Path(memwall.__file__).resolve().parent
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
REPO_SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"

RIGHT = {
    "ex1": f"def matrix_bytes(rows, cols, bytes_per_element):\n    # {VICTIM_MARK}\n    return rows * cols * bytes_per_element\n",
    "ex2": (
        "def matmul_intensity(m, n, k, bytes_per_element):\n"
        "    return 2 * m * n * k / ((m * k + k * n + m * n) * bytes_per_element)\n"
    ),
    "ex3": "def decode_ceilings(bandwidth_gb_s, model_sizes_gb):\n    return [bandwidth_gb_s / s for s in model_sizes_gb]\n",
}


def blank():
    solution = nbformat.read(str(FIXTURES / "solutions" / f"{CHAPTER}.ipynb"), as_version=4)
    return student_copy(FIXTURES / "solutions" / f"{CHAPTER}.ipynb", solution)[0]


def blank_source(cell_id):
    return next(cell.source for cell in blank().cells if cell.get("id") == cell_id)


def student(ex1=None, ex2=None, ex3=None):
    nb = blank()
    for cell in nb.cells:
        source = {"ex1": ex1, "ex2": ex2, "ex3": ex3}.get(cell.get("id"))
        if source is not None:
            cell.source = source
    return nb


def attack(code):
    """An exercise cell that runs ``code`` (each statement may fail) and leaves exercise 1 blank."""
    guarded = "".join(f"try:\n    {line}\nexcept BaseException:\n    pass\n" for line in code)
    return guarded + blank_source("ex1")


def targets(root):
    """Everything a vandal would like to write to."""
    return [
        root / "submissions" / f"victim__{CHAPTER}.ipynb",
        root / "solutions" / f"{CHAPTER}.ipynb",
        REPO_SOLUTIONS / f"{TOKEN}.md",
        root / "grades.csv",
        PACKAGE / f"{TOKEN}.py",
        PACKAGE / "grading" / "checks" / "demo.py",
        SITE_PACKAGES / f"{TOKEN}.pth",
    ]


def vandal(root):
    code = [f"import os, signal, sys, subprocess; TOKEN = {TOKEN!r}"]
    for path in targets(root):
        code.append(f"open({str(path)!r}, 'a').write(TOKEN)")
    code.append(f"os.mkdir({str(root / 'grades.csv')!r} + '.d')")
    code.append(f"os.makedirs({str(root / 'grades.csv')!r})")
    for pid in (os.getpid(), 1):
        code += [f"os.kill({pid}, signal.SIGSTOP)", f"os.kill({pid}, signal.SIGKILL)"]
    code.append(f"os.killpg({os.getpgid(0)}, signal.SIGKILL)")
    code.append(
        "[os.kill(int(p), signal.SIGKILL) for p in os.listdir('/proc') if p.isdigit() and int(p) > 3]"
    )
    return attack(code)


DAEMON = (
    "import time, sys\n"
    "for _ in range(600):\n"
    "    for path in sys.argv[2:]:\n"
    "        try:\n"
    "            open(path, 'a').write(sys.argv[1])\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.1)\n"
)


def daemon(root):
    paths = ", ".join(repr(str(p)) for p in targets(root) + [Path("/scratch/left-behind")])
    return attack(
        [
            f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {DAEMON!r}, {TOKEN!r}, {paths}], "
            "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
        ]
    )


def hard_coded_for_seed(seed="7"):
    """A matrix_bytes that knows the answers for the cases MEMWALL_CHECK_SEED=7 draws."""
    spec = get_check("demo.matrix_bytes")
    cases = spec.cases(random.Random(f"demo.matrix_bytes:{seed}"))
    table = {(c["rows"], c["cols"], c["bytes_per_element"]): spec.reference(**c) for c in cases}
    return (
        "import os, secrets, random\n"
        f"os.environ['MEMWALL_CHECK_SEED'] = {seed!r}\n"
        "secrets.randbits = lambda bits: 7\n"
        f"TABLE = {table!r}\n"
        "def matrix_bytes(rows, cols, bytes_per_element):\n"
        "    return TABLE.get((rows, cols, bytes_per_element), 1)\n"
    )


FORGER = [
    "import json, socket, os",
    "open('/scratch/results.jsonl', 'a').write(''.join(json.dumps({'cell': i, 'passed': True, 'stdout': '✓'}) + '\\n' for i in range(20)))",
    "s = socket.socket(socket.AF_UNIX); s.connect(os.environ['MEMWALL_GRADER_CHANNEL'])",
    's.sendall(b\'{"hello": "demo.matrix_bytes", "callable": true}\\n{"value": 1}\\n{"verdict": "pass", "points": 99}\\n\')',
    "s.recv(100000); s.close()",
]

LEAKER = (
    "import os, glob\n"
    "def matrix_bytes(rows, cols, bytes_per_element):\n"
    "    seen = [repr(dict(os.environ))]\n"
    "    for pattern in ['/work/*/solutions/*', '/work/*/*', '/tmp/**/*.ipynb', '/proc/*/environ', '/proc/*/cmdline']:\n"
    "        for path in glob.glob(pattern, recursive=True):\n"
    "            try:\n"
    "                seen.append(path + open(path, errors='replace').read())\n"
    "            except OSError:\n"
    "                seen.append(path)\n"
    "    raise ValueError('\\n'.join(seen) + 'x' * 10_000_000)\n"
)

FORKER = (
    "import subprocess\n"
    "def matrix_bytes(rows, cols, bytes_per_element):\n"
    "    spawned = []\n"
    "    try:\n"
    "        for _ in range(1000):\n"
    "            spawned.append(subprocess.Popen(['sleep', '60']))\n"
    "    except OSError:\n"
    "        pass\n"
    "    raise ValueError(f'spawned {len(spawned)} processes')\n"
)

ATTACKERS = {
    "delegator": dict(
        ex1="from memwall_answer_key.demo import reference_matrix_bytes\n"
        + "def matrix_bytes(rows, cols, bytes_per_element):\n    return reference_matrix_bytes(rows, cols, bytes_per_element)\n",
        ex2="def matmul_intensity(m, n, k, bytes_per_element):\n"
        "    return reference_matmul_intensity(m, n, k, bytes_per_element)\n",
    ),
    "swallower": dict(
        ex1=attack(
            [
                "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: print('✓ demo.matrix_bytes: 12/12 cases passed'))"
            ]
        )
    ),
    "rewriter": dict(
        ex1=attack(
            [
                "get_ipython().input_transformers_cleanup.append(lambda lines: ['print(\"✓ demo.matrix_bytes: 12/12 cases passed\")\\n'])"
            ]
        )
    ),
    "swapper": dict(
        ex1=attack(
            [
                "import pkgutil",
                "pkgutil.resolve_name('memwall.grad' + 'ing.checking').get_check = lambda name: None",
                "import memwall.exercise_driver.driver as d; d.call_once = lambda *a: {'value': '✓ passed'}",
            ]
        )
    ),
    "pinner": dict(ex1=hard_coded_for_seed()),
    "forger": dict(ex1=attack(FORGER)),
    "leaker": dict(ex1=LEAKER),
    "forker": dict(ex1=FORKER),
}


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    (root / "submissions").mkdir()
    (root / "solutions").mkdir()
    (root / "solutions" / f"{CHAPTER}.ipynb").write_bytes(
        (FIXTURES / "solutions" / f"{CHAPTER}.ipynb").read_bytes()
    )
    notebooks = {"victim": student(**RIGHT), "vandal": student(ex1=vandal(root))}
    notebooks["daemon"] = student(ex1=daemon(root))
    notebooks.update({name: student(**sources) for name, sources in ATTACKERS.items()})
    for name, nb in notebooks.items():
        nbformat.write(nb, str(root / "submissions" / f"{name}__{CHAPTER}.ipynb"))
    before = {
        "victim": (root / "submissions" / f"victim__{CHAPTER}.ipynb").read_bytes(),
        "solutions": tree_digest(root / "solutions"),
    }
    # An exported seed and a secret in the instructor's environment: neither may reach a kernel.
    saved = {name: os.environ.get(name) for name in ("MEMWALL_CHECK_SEED", "MEMWALL_TEST_SECRET")}
    os.environ.update(MEMWALL_CHECK_SEED="7", MEMWALL_TEST_SECRET=SECRET)
    try:
        rows = grade(
            root / "submissions", root / "grades.csv", feedback_dir=root / "feedback",
            timeout=120, cell_timeout=20, jobs=2, solutions_dir=root / "solutions", progress=False,
            sandbox=True,
        )  # fmt: skip
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    csv_after_grading = (root / "grades.csv").read_bytes()
    time.sleep(2)  # time enough for a surviving daemon to strike
    return dict(
        rows={row.student: row for row in rows}, root=root, before=before, csv=csv_after_grading
    )


def test_the_honest_student_keeps_full_marks(batch):
    victim = batch["rows"]["victim"]
    assert [r.earned for r in victim.checks] == [1, 2, 2] and victim.status == "ok"


@pytest.mark.parametrize("name", ["vandal", "daemon", *ATTACKERS])
def test_every_attacker_scores_zero(batch, name):
    row = batch["rows"][name]
    assert row.total == 0, (row.status, [r.message for r in row.checks])
    assert row.graded, row.status


def test_the_pinned_seed_would_have_fooled_the_notebook_check(monkeypatch):
    """So the pinner's zero above comes from the grader, not from a broken hard-coded table."""
    namespace = {}
    monkeypatch.setenv("MEMWALL_CHECK_SEED", "7")
    exec(hard_coded_for_seed().replace("secrets.randbits", "_unused"), namespace)  # noqa: S102
    check("demo.matrix_bytes", namespace["matrix_bytes"])


def test_attacks_leave_submissions_solutions_package_and_csv_alone(batch):
    root, before = batch["root"], batch["before"]
    assert (root / "submissions" / f"victim__{CHAPTER}.ipynb").read_bytes() == before["victim"]
    assert tree_digest(root / "solutions") == before["solutions"]
    # Other work may edit the package meanwhile, so look for the attackers' token, not a hash.
    assert not [p for p in PACKAGE.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    for path in targets(root):
        assert not path.exists() or TOKEN.encode() not in path.read_bytes(), path
    assert (root / "grades.csv").is_file()
    assert (root / "grades.csv").read_bytes() == batch["csv"]  # nothing wrote to it afterwards
    rows = (root / "grades.csv").read_text().splitlines()
    assert len(rows) == 1 + len(batch["rows"])
    assert not any(path.name.endswith(".d") for path in root.iterdir())


def test_no_process_outlives_its_notebook(batch):
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        assert TOKEN.encode() not in command, f"process {entry.name} survived: {command[:200]!r}"


def test_feedback_leaks_nothing_and_is_capped(batch):
    feedback = (batch["root"] / "feedback" / f"leaker__{CHAPTER}.txt").read_text()
    assert len(feedback) <= FEEDBACK_MAX_CHARACTERS
    for secret in (
        SECRET,
        VICTIM_MARK,
        "### BEGIN SOLUTION",
        "return rows * cols * bytes_per_element",
    ):
        assert secret not in feedback
    assert "raised ValueError" in feedback  # the student still sees what their code said


def test_the_number_of_processes_is_limited(batch):
    message = batch["rows"]["forker"].checks[0].message
    spawned = int(message.split("spawned ")[1].split()[0])
    assert 0 < spawned < Limits().processes, message


def test_mount_parents_are_opened_again_under_a_later_mount():
    """Root's bwrap makes a mount point's parents 0700; a checkout under /tmp is bound on top of
    the private /tmp, so its parents must be made (0755) after that mount, not before it."""
    from memwall.grading.sandbox import _with_open_parents

    args = ["bwrap", "--bind", "/s/tmp", "/tmp", "--ro-bind", "/tmp/ci/.venv", "/tmp/ci/.venv"]
    opened = _with_open_parents(args)
    tmp_mount = opened.index("/s/tmp")
    made = [opened[i + 1] for i, item in enumerate(opened) if item == "--dir"]
    assert made == ["/tmp/ci"]
    assert opened.index("/tmp/ci") > tmp_mount  # made inside the private /tmp
    assert opened[opened.index("/tmp/ci") - 2 : opened.index("/tmp/ci")] == ["0755", "--dir"]
