"""External weights: load other weights, swap them under load, rebuild a new version without recompiling."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.spec import load_spec
from pipeline.stages.loader import load_model

from .conftest import REPO, BuildDirs, pip_install, run_cli

EXTERNAL_SPEC = REPO / "tests" / "models" / "tiny" / "external.toml"


@pytest.fixture(scope="module")
def external_build(tmp_path_factory) -> BuildDirs:
    base = tmp_path_factory.mktemp("external")
    dirs = BuildDirs(root=base / "opt", dist=base / "dist", build=base / "build")
    ran = run_cli("build", "--spec", str(EXTERNAL_SPEC), *dirs.args())
    assert ran.code == 0, ran.err
    return dirs


@pytest.fixture(scope="module")
def external_installed(installed, external_build) -> Path:
    pip_install(installed, str(next(external_build.dist.glob("*.whl"))))
    return installed


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory, external_build) -> dict[str, Path]:
    """The packaged weights, a perturbed set (a 'fine-tune'), and broken sets."""
    folder = tmp_path_factory.mktemp("weights")
    original = load_file(str(external_build.build / "tiny_external" / "0.1" / "cpu" / "weights.safetensors"))
    generator = torch.Generator().manual_seed(3)
    tuned = {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    broken = dict(tuned)
    del broken["head.bias"]
    broken["extra.weight"] = torch.zeros(2)
    broken["conv.weight"] = torch.zeros(8, 3, 5, 5)
    files = {"original": original, "tuned": tuned, "broken": broken}
    for name, tensors in files.items():
        save_file(tensors, str(folder / f"{name}.safetensors"))
    return {name: folder / f"{name}.safetensors" for name in files}


def run_in(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/", env=os.environ.copy())


def eager_with(weights: Path) -> torch.nn.Module:
    module = load_model(load_spec(EXTERNAL_SPEC)).module
    module.load_state_dict(load_file(str(weights)))
    return module


def test_wheel_carries_weights_outside_the_so(external_build):
    wheel = next(external_build.dist.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        manifest = json.loads(archive.read("model_tiny_external/manifest.json"))
        assert "model_tiny_external/weights.safetensors" in archive.namelist()
    weights = manifest["weights"]
    assert weights["external"] is True and weights["file"] == "weights.safetensors"
    assert weights["tensors"]["conv.weight"] == {"shape": [8, 3, 3, 3], "dtype": "float32"}
    assert len(weights["sha256"]) == 64
    assert manifest["compile_options"]["aot_inductor.package_constants_in_so"] is False


def test_other_weights_match_eager_with_those_weights(external_installed, weight_files, tmp_path):
    out = tmp_path / "out.pt"
    code = (
        "import torch, model_tiny_external as m\n"
        f"model = m.load(weights={str(weight_files['tuned'])!r})\n"
        "args = m.example_inputs(seed=4, batch=3)\n"
        f"torch.save((args, model(*args), m.load()(*args)), {str(out)!r})\n"
    )
    ran = run_in(external_installed, code)
    assert ran.returncode == 0, ran.stderr
    args, tuned, packaged = torch.load(out)
    with torch.no_grad():
        expected = eager_with(weight_files["tuned"])(*args)
    for got, want in zip(tuned, expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(tuned[1], packaged[1], atol=1e-3), "the tuned weights must change the outputs"


def test_weights_that_do_not_fit_are_listed_and_nothing_loads(external_installed, weight_files):
    code = (
        "import model_tiny_external as m\n"
        f"try:\n    m.load(weights={str(weight_files['broken'])!r})\n"
        "except m.WeightsMismatch as e:\n    print(e)\n"
    )
    ran = run_in(external_installed, code)
    assert ran.returncode == 0, ran.stderr
    assert "does not fit the model (nothing was loaded)" in ran.stdout
    assert "missing head.bias" in ran.stdout and "unexpected extra.weight" in ran.stdout
    assert "mis-shaped conv.weight: float32[8, 3, 5, 5], the model needs float32[8, 3, 3, 3]" in ran.stdout


def test_load_numpy_refuses_external_weights(external_installed):
    code = (
        "import model_tiny_external as m\ntry:\n    m.load_numpy()\nexcept m.NativeRuntimeError as e:\n    print(e)\n"
    )
    ran = run_in(external_installed, code)
    assert ran.returncode == 0, ran.stderr
    assert (
        "keeps its weights outside the .so; load_numpy() runs models with embedded weights only: use load()"
        in ran.stdout
    )


def test_embedded_weights_cannot_be_replaced(installed, weight_files):
    code = (
        f"import model_tiny\ntry:\n    model_tiny.load(weights={str(weight_files['tuned'])!r})\n"
        "except ValueError as e:\n    print(e)\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0 and "has its weights compiled into the .so" in ran.stdout, ran.stderr


SWAP_UNDER_LOAD = """
import threading, time, torch, model_tiny_external as m
a, b = {a!r}, {b!r}
args = m.example_inputs(seed=1)
want = {{"a": m.load(weights=a)(*args), "b": m.load(weights=b)(*args)}}
model = m.load(num_models=2, weights=a)
seen, mixed, stop = {{"a": 0, "b": 0}}, [], threading.Event()

def call():
    while not stop.is_set():
        got = model(*args)
        match = [k for k, w in want.items() if all(torch.equal(g, x) for g, x in zip(got, w))]
        if match:
            seen[match[0]] += 1
        else:
            mixed.append(got)

threads = [threading.Thread(target=call) for _ in range(3)]
for t in threads:
    t.start()
for i in range(40):
    model.swap_weights(b if i % 2 == 0 else a)
    time.sleep(0.01)
stop.set()
for t in threads:
    t.join()
print(seen["a"], seen["b"], len(mixed))
"""


def test_swap_under_concurrent_calls_never_mixes(external_installed, weight_files):
    ran = run_in(
        external_installed, SWAP_UNDER_LOAD.format(a=str(weight_files["original"]), b=str(weight_files["tuned"]))
    )
    assert ran.returncode == 0, ran.stderr
    seen_a, seen_b, mixed = map(int, ran.stdout.split())
    assert mixed == 0
    assert seen_a > 0 and seen_b > 0, "calls must have run on both sets of weights"


def test_new_weights_make_a_new_version_without_recompiling(external_build, weight_files, tmp_path):
    ran = run_cli(
        "build",
        "--spec",
        str(EXTERNAL_SPEC),
        "--weights",
        str(weight_files["tuned"]),
        "--version",
        "0.2",
        "--root",
        str(external_build.root),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(external_build.build),
    )
    assert ran.code == 0, ran.err
    assert "reused the compiled model from build cache" in ran.err and "no export, no recompile" in ran.err
    assert "==> export" not in ran.err and "==> compile" in ran.err
    # nothing generated: the report names no sources folder (H41 looked in one that was never made)
    assert json.loads(next((tmp_path / "dist").glob("*.report.json")).read_text())["sources_dir"] is None
    first, second = next(external_build.dist.glob("*.whl")), next((tmp_path / "dist").glob("*.whl"))
    assert second.name.startswith("model_tiny_external-0.2+cpu.torch")
    manifests = []
    for wheel in (first, second):
        with zipfile.ZipFile(wheel) as archive:
            manifests.append(json.loads(archive.read("model_tiny_external/manifest.json")))
    assert manifests[0]["artifacts"] == manifests[1]["artifacts"], "the same .so"
    assert manifests[0]["weights"]["sha256"] != manifests[1]["weights"]["sha256"]
    assert manifests[1]["compile_cache_key"] == manifests[0]["compile_cache_key"]


def test_new_weights_need_a_new_version(weight_files):
    ran = run_cli("build", "--spec", str(EXTERNAL_SPEC), "--weights", str(weight_files["tuned"]))
    assert ran.code == 2 and "needs a new version: add --version" in ran.err


def test_publish_refuses_a_wheel_whose_weights_were_altered(external_build, tmp_path):
    from pipeline.errors import UnverifiedWheelError

    wheel = next(external_build.dist.glob("*.whl"))
    altered = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(altered, "w") as copy:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("weights.safetensors"):
                data = data[:-1] + bytes([data[-1] ^ 1])
            copy.writestr(info, data)
    ran = run_cli("publish", "--wheel", str(altered), "--index", "http://127.0.0.1:9/", cwd=tmp_path)
    assert ran.code == UnverifiedWheelError.exit_code, ran.err
    assert "model_tiny_external/weights.safetensors does not match the sha256 in its manifest" in ran.err
