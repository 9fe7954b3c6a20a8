"""The CUDA target on a real GPU: build, install, load (rootless too), verify, pick a device,
embedded kernels, multi-arch PTX. `make test-gpu` runs these with the interpreter's CUDA torch; without a GPU
(CI, this project's CPU machines) every one skips.

Three builds, each a group of its own (xdist_group): `make test-gpu` runs them side by side in three
processes (`-n 3 --dist loadgroup`), where one after another they took 240 s of an H200 loan."""

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
    pytest.mark.skipif(
        torch.version.cuda is None or not torch.cuda.is_available(), reason="needs a CUDA torch and a GPU"
    ),
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
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return python


def run_in(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-W", "default", "-c", code], capture_output=True, text=True, cwd="/", env=os.environ
    )


def manifest_of(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))


@pytest.fixture(scope="module")
def cuda_wheel(tmp_path_factory) -> tuple[BuildDirs, Path, Path]:
    base = tmp_path_factory.mktemp("cuda")
    dirs, wheel = build_cuda(base)
    return dirs, wheel, installed_python(base / "env", wheel)


@pytest.mark.xdist_group("cuda_wheel")
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


@pytest.mark.xdist_group("cuda_wheel")
def test_loads_runs_on_the_gpu_and_verifies(cuda_wheel):
    _, _, python = cuda_wheel
    ran = run_in(
        python,
        "import model_tiny as t; m = t.load(); out = m(*t.example_inputs()); "
        "print(m.device, out[0].device); print(all(r.passed for r in t.verify(m)))",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [f"cuda:{torch.cuda.current_device()}", f"cuda:{torch.cuda.current_device()}", "True"]


@pytest.mark.xdist_group("cuda_wheel")
def test_rootless_install_finds_its_kernels_without_the_link(cuda_wheel):
    dirs, wheel, python = cuda_wheel
    opt_path = Path(manifest_of(wheel)["opt_path"])
    if opt_path.is_symlink():
        opt_path.unlink()
    shutil.rmtree(dirs.root, ignore_errors=True)
    dirs.root.parent.mkdir(parents=True, exist_ok=True)
    dirs.root.write_text("a file where the artifact root should be: no link can be made")
    try:
        ran = run_in(
            python, "import model_tiny as t; m = t.load(); print(m.library); print(all(r.passed for r in t.verify(m)))"
        )
        assert ran.returncode == 0, ran.stderr
        assert "site-packages/model_tiny/artifacts/" in ran.stdout and ran.stdout.split()[-1] == "True"
        assert "ArtifactLinkWarning" not in ran.stderr  # the fallback works, so it is not warned about
    finally:
        dirs.root.unlink()


@pytest.mark.xdist_group("cuda_wheel")
def test_device_is_chosen_and_a_missing_one_refused(cuda_wheel):
    _, _, python = cuda_wheel
    last, count = torch.cuda.device_count() - 1, torch.cuda.device_count()
    ran = run_in(
        python,
        f"import model_tiny as t; m = t.load(device='cuda:{last}'); "
        f"print(m(*t.example_inputs(device='cuda:{last}'))[0].device)",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"cuda:{last}"
    refused = run_in(python, f"import model_tiny as t; t.load(device='cuda:{count}')")
    assert refused.returncode != 0 and f"cuda:{count} does not exist" in refused.stderr


@pytest.mark.xdist_group("embed_kernels")
def test_embedded_kernels_ship_only_the_library(tmp_path):
    _, wheel = build_cuda(tmp_path, "\n[build.cuda]\nembed_kernels = true\n")
    m = manifest_of(wheel)
    assert m["cuda"]["embed_kernels"] and m["cuda"]["kernels"] == [] and list(m["artifacts"]) == [m["library"]]
    python = installed_python(tmp_path / "env", wheel)
    ran = run_in(python, "import model_tiny as t; print(all(r.passed for r in t.verify(t.load())))")
    assert ran.returncode == 0 and ran.stdout.strip() == "True", ran.stderr


@pytest.mark.xdist_group("multi_arch")
def test_multi_arch_ships_ptx_and_fatbin(tmp_path):
    _, wheel = build_cuda(tmp_path, "\n[build.cuda]\nmulti_arch = true\n")
    m = manifest_of(wheel)
    suffixes = {Path(k).suffix for k in m["cuda"]["kernels"]}
    assert m["cuda"]["multi_arch"] and {".ptx", ".fatbin"} <= suffixes, m["cuda"]["kernels"]
    python = installed_python(tmp_path / "env", wheel)
    ran = run_in(python, "import model_tiny as t; print(all(r.passed for r in t.verify(t.load())))")
    assert ran.returncode == 0 and ran.stdout.strip() == "True", ran.stderr


# CUDA graphs (issue 42; the CPU side is tests/test_cuda_graphs.py): one process checks them all
# against torch's runner (load(cuda_graphs=False)) and prints what it saw as JSON.
GRAPHS = r"""
import json, threading, warnings
import torch
import model_tiny as t
from model_tiny._direct import DirectRunner, DirectUnavailable
from model_tiny._graphs import GraphCaptureWarning, GraphRunner
from model_tiny._target_cuda import CudaGraphs, stream
from model_tiny._weights import load_into

def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))

graphs, runner = t.load(), t.load(cuda_graphs=False)
seen = {"info": graphs.info(), "runner_info": runner.info()}
x1, x1b, x4 = (list(t.example_inputs(seed=s, batch=b)) for s, b in ((1, 1), (7, 1), (4, 4)))
seen["equal"] = [same(graphs(*x), runner(*x)) for x in (x1, x1b, x4, x1)]  # x1b: new data through batch 1's graph
seen["graphs"] = graphs.info()["graphs"]
kept = graphs(*x1)
graphs(*x4)
seen["owned"] = same(kept, runner(*x1))

cases = [list(t.example_inputs(seed=10 + s, batch=b)) for b in (1, 4) for s in range(4)]
answers = [list(runner(*x)) for x in cases]
wrong = []
def caller(index):
    for round in range(25):
        case = (index + 3 * round) % len(cases)
        if not same(graphs(*cases[case]), answers[case]):
            wrong.append((index, round, case))
workers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
[w.start() for w in workers]
[w.join() for w in workers]
seen["threads_wrong"] = wrong

before = list(graphs(*x1))
doubled = {name: 2 * tensor if tensor.is_floating_point() else tensor
           for name, tensor in runner._runner.extract_constants_map(False).items()}
try:
    for model in (graphs, runner):
        load_into(model._runner, doubled, inactive=True)
        model._runner.swap_constant_buffer()
    after = list(graphs(*x1))
    seen["swap"] = same(after, runner(*x1)) and not same(after, before)
except DirectUnavailable as exc:  # a .so from a torch without the constants' C-ABI-safe calls
    seen["swap"] = str(exc)

class Syncing(CudaGraphs):  # a real capture that fails: synchronising is not allowed while capturing
    def capture(self, run, warmups):
        return super().capture(lambda: (torch.cuda.synchronize(), run())[1], warmups)

fresh = t.load(cuda_graphs=False)
refusing = GraphRunner(DirectRunner(fresh.library, fresh.device, t._manifest.ARTIFACTS_DIR, stream(fresh.device)),
                       Syncing(fresh.device), "model_tiny 0.1")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    seen["fallback_equal"] = [same(refusing.run(x), fresh(*x)) for x in (x1, x4, x1)]
seen["fallback_warnings"] = [str(w.message) for w in caught if w.category is GraphCaptureWarning]
seen["fallback_info"] = refusing.info()
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def graphs_seen(cuda_wheel) -> dict:
    _, _, python = cuda_wheel
    ran = run_in(python, GRAPHS)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


@pytest.mark.xdist_group("cuda_wheel")
def test_cuda_graphs_are_the_default_and_replay_the_runners_outputs_bitwise(graphs_seen):
    seen = graphs_seen
    assert seen["info"]["path"] == "CUDA graphs" and seen["info"]["copy_outputs"] is True, seen["info"]
    assert seen["runner_info"]["path"] == "AOTInductor runner"
    assert seen["runner_info"]["graphs_off"] == "load(cuda_graphs=False)"
    assert seen["equal"] == [True, True, True, True]
    # one per batch size, least recently used first: x1b replayed batch 1's graph
    assert seen["graphs"] == [[[4, 3, 8, 8], [4]], [[1, 3, 8, 8], [1]]]
    assert seen["owned"] is True


@pytest.mark.xdist_group("cuda_wheel")
def test_cuda_graphs_from_four_threads(graphs_seen):
    assert graphs_seen["threads_wrong"] == []


@pytest.mark.xdist_group("cuda_wheel")
def test_a_weight_swap_recaptures_on_the_new_weights(graphs_seen):
    if graphs_seen["swap"] is not True and "exports no" in str(graphs_seen["swap"]):
        pytest.skip(f"this torch's .so cannot take constants through ctypes: {graphs_seen['swap']}")
    assert graphs_seen["swap"] is True


@pytest.mark.xdist_group("cuda_wheel")
def test_a_failed_capture_warns_once_and_runs_without_graphs(graphs_seen):
    seen = graphs_seen
    assert seen["fallback_equal"] == [True, True, True]
    assert (
        len(seen["fallback_warnings"]) == 1
        and "capturing the model in a CUDA graph failed" in seen["fallback_warnings"][0]
    )
    assert seen["fallback_info"]["path"] == "single-threaded entry point, without CUDA graphs"


@pytest.mark.xdist_group("cuda_wheel")
def test_the_environment_variable_turns_cuda_graphs_off(cuda_wheel):
    _, _, python = cuda_wheel
    code = "import model_tiny as t; m = t.load(); print(m.info()['path'], m.info()['graphs_off'])"
    ran = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "MODELWHEEL_CUDA_GRAPHS": "0"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "AOTInductor runner MODELWHEEL_CUDA_GRAPHS=0"
