"""The CUDA target on a real GPU: build, install, load (rootless too), verify, pick a device,
embedded kernels, multi-arch PTX. `make test-gpu` runs these with the interpreter's CUDA torch; without a GPU
(CI, this project's CPU machines) every one skips."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch

from benchmarks import torch_venv

from .conftest import TINY_SPEC, BuildDirs, run_cli

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.version.cuda is None or not torch.cuda.is_available(), reason="needs a CUDA torch and a GPU"),
]


def build_cuda(base: Path, extra_toml: str = "") -> tuple[BuildDirs, Path]:
    spec = base / "spec.toml"
    spec.write_text(TINY_SPEC.read_text() + extra_toml)
    shutil.copy(TINY_SPEC.parent / "tiny_model.py", base / "tiny_model.py")
    dirs = BuildDirs(root=base / "opt", dist=base / "dist", build=base / "build")
    ran = run_cli("build", "--spec", str(spec), "--target", "cuda", *dirs.args(), timeout=1200)
    assert ran.code == 0, ran.err
    [wheel] = dirs.dist.glob("*.whl")
    return dirs, wheel


def installed_python(path: Path, wheel: Path) -> Path:
    """A venv seeing this interpreter's CUDA torch (GPU images have no network to fetch another)."""
    python = torch_venv.create(path)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return python


def run_in(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-W", "default", "-c", code], capture_output=True, text=True, cwd="/", env=os.environ)


def manifest_of(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))


@pytest.fixture(scope="module")
def cuda_wheel(tmp_path_factory) -> tuple[BuildDirs, Path, Path]:
    base = tmp_path_factory.mktemp("cuda")
    dirs, wheel = build_cuda(base)
    return dirs, wheel, installed_python(base / "env", wheel)


def test_wheel_carries_so_and_kernels_and_names_the_cuda_build(cuda_wheel):
    _, wheel, _ = cuda_wheel
    variant = "cu" + torch.version.cuda.replace(".", "")
    assert wheel.name.startswith(f"model_tiny-0.1+{variant}.torch{torch.__version__.split('+')[0]}-"), wheel.name
    m = manifest_of(wheel)
    major, minor = torch.cuda.get_device_capability()
    assert m["target"] == "cuda" and m["cuda"]["version"] == torch.version.cuda
    assert m["cuda"]["capability"] == f"{major}.{minor}" and m["cuda"]["gpu"] == torch.cuda.get_device_name()
    assert m["cuda"]["kernels"] and all(k.endswith(".cubin") for k in m["cuda"]["kernels"])
    assert m["opt_path"].endswith("/tiny/0.1/cuda")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).name for n in archive.namelist() if "/artifacts/" in n}
    assert set(m["cuda"]["kernels"]) | {m["library"]} == shipped
    assert all(m["artifacts"][k]["sha256"] for k in m["cuda"]["kernels"])


def test_loads_runs_on_the_gpu_and_verifies(cuda_wheel):
    _, _, python = cuda_wheel
    ran = run_in(python, "import model_tiny as t; m = t.load(); out = m(*t.example_inputs()); "
                         "print(m.device, out[0].device); print(all(r.passed for r in t.verify(m)))")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [f"cuda:{torch.cuda.current_device()}", f"cuda:{torch.cuda.current_device()}", "True"]


def test_rootless_install_finds_its_kernels_without_the_link(cuda_wheel):
    dirs, wheel, python = cuda_wheel
    opt_path = Path(manifest_of(wheel)["opt_path"])
    if opt_path.is_symlink():
        opt_path.unlink()
    shutil.rmtree(dirs.root, ignore_errors=True)
    dirs.root.parent.mkdir(parents=True, exist_ok=True)
    dirs.root.write_text("a file where the artifact root should be: no link can be made")
    try:
        ran = run_in(python, "import model_tiny as t; m = t.load(); print(m.library); print(all(r.passed for r in t.verify(m)))")
        assert ran.returncode == 0, ran.stderr
        assert "site-packages/model_tiny/artifacts/" in ran.stdout and ran.stdout.split()[-1] == "True"
        assert "ArtifactLinkWarning" not in ran.stderr  # the fallback works, so it is not warned about
    finally:
        dirs.root.unlink()


def test_device_is_chosen_and_a_missing_one_refused(cuda_wheel):
    _, _, python = cuda_wheel
    last, count = torch.cuda.device_count() - 1, torch.cuda.device_count()
    ran = run_in(python, f"import model_tiny as t; m = t.load(device='cuda:{last}'); print(m(*t.example_inputs(device='cuda:{last}'))[0].device)")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"cuda:{last}"
    refused = run_in(python, f"import model_tiny as t; t.load(device='cuda:{count}')")
    assert refused.returncode != 0 and f"cuda:{count} does not exist" in refused.stderr


def test_embedded_kernels_ship_only_the_library(tmp_path):
    _, wheel = build_cuda(tmp_path, "\n[build.cuda]\nembed_kernels = true\n")
    m = manifest_of(wheel)
    assert m["cuda"]["embed_kernels"] and m["cuda"]["kernels"] == [] and list(m["artifacts"]) == [m["library"]]
    python = installed_python(tmp_path / "env", wheel)
    ran = run_in(python, "import model_tiny as t; print(all(r.passed for r in t.verify(t.load())))")
    assert ran.returncode == 0 and ran.stdout.strip() == "True", ran.stderr


def test_multi_arch_ships_ptx_and_fatbin(tmp_path):
    _, wheel = build_cuda(tmp_path, "\n[build.cuda]\nmulti_arch = true\n")
    m = manifest_of(wheel)
    suffixes = {Path(k).suffix for k in m["cuda"]["kernels"]}
    assert m["cuda"]["multi_arch"] and {".ptx", ".fatbin"} <= suffixes, m["cuda"]["kernels"]
    python = installed_python(tmp_path / "env", wheel)
    ran = run_in(python, "import model_tiny as t; print(all(r.passed for r in t.verify(t.load())))")
    assert ran.returncode == 0 and ran.stdout.strip() == "True", ran.stderr
