"""Static batch sizes: spec checks, the build (each size compiled and verified), the wheel's dispatch
through load() and load_numpy(), padding and its gate, shared external weights, `model-x verify`."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline import targets
from pipeline.errors import SpecError
from pipeline.spec import load_spec
from pipeline.stages.loader import load_model
from pipeline.wheel_template.runtime import _dispatch, _inputs

from .conftest import REPO, BuildDirs, make_venv, pip_install, run_cli

MODELS = REPO / "tests" / "models" / "static"
SPEC, EXTERNAL, MIXING = MODELS / "spec.toml", MODELS / "external.toml", MODELS / "mixing.toml"


def spec_with(tmp_path: Path, dims: str, shapes: tuple[str, str] = ('["batch", 3, 8, 8]', '["batch"]')) -> Path:
    text = SPEC.read_text()
    start, end = text.index("[dims.batch]"), text.index("[[inputs]]")
    text = text[:start] + dims + "\n" + text[end:]
    text = text.replace('shape = ["batch", 3, 8, 8]', f"shape = {shapes[0]}").replace(
        'shape = ["batch"]', f"shape = {shapes[1]}"
    )
    path = tmp_path / "spec.toml"
    path.write_text(text)
    (tmp_path / "static_model.py").write_text((MODELS / "static_model.py").read_text())
    return path


@pytest.mark.parametrize(
    "dims, shapes, key, words",
    [
        ("[dims.batch]\nmin = 1\nmax = 4\nstatic = [2, 2]", None, "dims.batch.static", "names a size twice"),
        (
            "[dims.batch]\nmin = 2\nmax = 4\nstatic = [1, 8]",
            None,
            "dims.batch.static",
            "[1, 8] outside [min, max] = [2, 4]",
        ),
        ("[dims.batch]\nmin = 1\nmax = 4\nstatic = [0]", None, "dims.batch.static[0]", "greater than or equal to 1"),
        ("[dims.batch]\nmin = 1\nmax = 4\npad = true", None, "dims.batch.pad", "needs static sizes to pad to"),
        (
            "[dims.batch]\nmin = 1\nmax = 4\n[dims.side]\nmin = 8\nmax = 8\nstatic = [8]",
            ('["batch", 3, "side", 8]', '["batch"]'),
            "dims.side.static",
            "only for the batch dim, the first axis of every input",
        ),
        (
            "[dims.batch]\nmin = 1\nmax = 4\nstatic = [2]\n[dims.other]\nmin = 1\nmax = 4\nstatic = [2]",
            ('["batch", 3, 8, 8]', '["batch"]'),
            "dims.other.static",
            "only one dim may have static sizes",
        ),
    ],
)
def test_spec_errors_name_the_file_and_key(tmp_path, dims, shapes, key, words):
    path = spec_with(tmp_path, dims, shapes or ('["batch", 3, 8, 8]', '["batch"]'))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(path) in caught.value.message
    assert f"key '{key}'" in caught.value.message and words in caught.value.message, caught.value.message


def test_a_spec_without_static_sizes_dumps_as_before():
    """Specs hash into cache keys and the content hash: the new keys are left out at their defaults."""
    dumped = load_spec(REPO / "tests" / "models" / "tiny" / "spec.toml").spec.model_dump()
    assert dumped["dims"]["batch"] == {"min": 1, "max": 4, "example": None}
    assert load_spec(SPEC).spec.dims["batch"].static == [2]


@pytest.mark.parametrize(
    "pad, expected",
    [
        (False, {1: (None, 1), 2: (2, 2), 3: (None, 3), 4: (4, 4), 5: (None, 5), 9: (None, 9)}),
        (True, {1: (2, 2), 2: (2, 2), 3: (4, 4), 4: (4, 4), 5: (None, 5), 9: (None, 9)}),
    ],
)
def test_route_picks_the_exact_size_else_pads_or_falls_back(pad, expected):
    manifest = {"static": {"dim": "batch", "pad": pad, "sizes": {"2": {}, "4": {}}}}
    assert {batch: _dispatch.route(manifest, batch) for batch in expected} == expected
    assert _dispatch.route({}, 3) == (None, 3)


def test_the_padding_gate_checks_the_sizes_the_wheel_pads():
    from pipeline.stages.static import padded_sizes

    assert padded_sizes([1, 2, 4, 8], 1) == {3: 4, 5: 8, 6: 8, 7: 8}
    assert padded_sizes([8, 2], 1) == {1: 2, 3: 8, 4: 8, 5: 8, 6: 8, 7: 8}
    manifest = {"static": {"dim": "batch", "pad": True, "sizes": {"2": {}, "8": {}}}}
    assert all(_dispatch.route(manifest, b) == (to, to) for b, to in padded_sizes([2, 8], 1).items())


def build(spec: Path, base: Path) -> tuple[BuildDirs, object]:
    dirs = BuildDirs(root=base / "opt", dist=base / "dist", build=base / "build")
    return dirs, run_cli("build", "--spec", str(spec), *dirs.args())


@pytest.fixture(scope="module")
def static_build(tmp_path_factory) -> tuple[BuildDirs, object]:
    dirs, ran = build(SPEC, tmp_path_factory.mktemp("static"))
    assert ran.code == 0, ran.err
    return dirs, ran


@pytest.fixture(scope="module")
def static_venv(tmp_path_factory, static_build) -> Path:
    python = make_venv(tmp_path_factory.mktemp("static-venv") / "env")
    pip_install(python, str(next(static_build[0].dist.glob("*.whl"))))
    return python


def wheel_manifest(dirs: BuildDirs, package: str) -> tuple[dict, list[str]]:
    with zipfile.ZipFile(next(dirs.dist.glob("*.whl"))) as archive:
        return json.loads(archive.read(f"{package}/manifest.json")), archive.namelist()


def test_build_compiles_and_verifies_every_size(static_build):
    dirs, ran = static_build
    for line in (
        "static batch=2: compiled",
        "static batch2: 7 cases passed",
        "padding: 1 padded sizes match eager",
    ):
        assert line in ran.err, ran.err
    manifest, names = wheel_manifest(dirs, "model_tiny_static")
    assert manifest["static"]["dim"] == "batch" and manifest["static"]["pad"] is True
    assert sorted(manifest["static"]["sizes"]) == ["2"]
    for size in ("2",):
        record = manifest["static"]["sizes"][size]
        assert record["library"] == f"batch{size}/model.so"
        assert f"model_tiny_static/artifacts/batch{size}/model.so" in names
        assert len(manifest["artifacts"][f"batch{size}/model.so"]["sha256"]) == 64
        assert record["golden_cases"] == [f"batch{size}/golden0", f"batch{size}/golden1"]
    # One constants store for the two models: each model's constants listed, each blob stored once,
    # and no .so embeds the weights (their bytes are in the store, in no library).
    assert set(manifest["constants"]) == {"constants.json", "constants.bin"}
    assert names.count("model_tiny_static/constants.bin") == 1
    with zipfile.ZipFile(next(dirs.dist.glob("*.whl"))) as archive:
        index = json.loads(archive.read("model_tiny_static/constants.json"))
        blob = archive.read("model_tiny_static/constants.bin")
        libraries = [archive.read(n) for n in names if n.endswith(".so")]
    assert sorted(index["models"]) == ["batch2/model.so", "model.so"]
    used = [entry["blob"] for model in index["models"].values() for entry in model.values()]
    assert len(set(used)) < len(used) and len(index["blobs"]) == len(
        set(used) | {e.get("md") for m in index["models"].values() for e in m.values()} - {None}
    )
    for key, where in index["blobs"].items():  # Inductor inlines tiny constants (biases here) into the code
        data = blob[where["offset"] : where["offset"] + where["size"]]
        assert len(data) < 64 or not any(data in library for library in libraries), key
    assert len(blob) < 2 * sum(where["size"] for where in index["blobs"].values()) + 64 * len(index["blobs"])
    report = json.loads(next(dirs.dist.glob("*.report.json")).read_text())
    # The static sizes are one stage of their own, after the dynamic model's verification.
    assert set(report["stages_s"]) == {"load", "doctor", "export", "compile", "verify", "static", "package"}
    for size in ("2",):
        cases = report["static"]["sizes"][size]["verification"]["cases"]
        assert {c["case"] for c in cases} >= {"seed0", "zeros", "large", "golden0"}
        assert all(c["sizes"] == {} and c["outputs"]["logits"]["passed"] for c in cases)
    assert report["static"]["padding"]["batch=1 padded to 2"]["features"]["passed"] is True


CALLS = """
import json, sys, numpy as np, torch, model_tiny_static as m
torch.manual_seed(0)
model, native = m.load(), m.load_numpy()
out = {}
for batch in (1, 2, 3, 4):
    x, t = m.example_inputs(seed=5, batch=batch)
    f, l = model(x, t)
    nf, nl = native(x.numpy(), t.numpy())
    out[batch] = {"route": model.route(batch), "so": str(model.last_library), "native_so": str(native.last_library),
                  "features": f.tolist(), "logits": l.tolist(), "native_logits": nl.tolist(), "shape": list(f.shape)}
json.dump(out, sys.stdout)
"""


def test_load_and_load_numpy_dispatch_on_the_batch(static_venv):
    done = subprocess.run([str(static_venv), "-c", CALLS], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    got = {int(k): v for k, v in json.loads(done.stdout).items()}
    assert got[1]["route"] == "static batch=2 (padded from 1)" and got[1]["so"].endswith("/batch2/model.so")
    assert got[2]["route"] == "static batch=2" and got[2]["so"].endswith("/batch2/model.so")
    assert got[3]["route"] == "dynamic" and got[4]["route"] == "dynamic"  # none as large to pad to
    assert got[4]["so"].endswith("/artifacts/model.so")  # a CPU wheel loads from its package
    module = load_model(load_spec(SPEC)).module
    for batch, result in got.items():
        assert result["native_so"] == result["so"]
        assert result["shape"] == [batch, 8, 8, 8]  # padded outputs are sliced back
        spec_inputs = [i.model_dump(exclude_none=True) for i in load_spec(SPEC).spec.inputs]
        x, t = _inputs.make_inputs(spec_inputs, {"batch": batch}, 5)
        with torch.no_grad():
            features, logits = module(x, t)
        torch.testing.assert_close(torch.tensor(result["features"]), features, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(result["logits"]), logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(result["native_logits"]), logits, rtol=1e-4, atol=1e-4)


def test_verify_command_covers_every_size(static_venv):
    done = subprocess.run(
        [str(static_venv.parent / "model-tiny-static"), "verify"], capture_output=True, text=True, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    for case in ("golden0", "batch2/golden0", "batch2/golden1"):
        assert f"ok  case {case}:" in done.stdout, done.stdout
    assert "4 golden cases match" in done.stdout
    info = subprocess.run([str(static_venv.parent / "model-tiny-static"), "info"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "  static    batch 2, each compiled on its own, the sizes between padded" in info.stdout.splitlines()
    assert "`model-tiny-static verify` runs its 4 golden cases here" in info.stdout


def test_padding_is_refused_for_a_model_that_mixes_the_batch(tmp_path):
    """Refused by the doctor, on eager, before any compile; the compiled models' gate (the same
    cases, the same refusal) passes in test_build_compiles_and_verifies_every_size."""
    dirs, ran = build(MIXING, tmp_path)
    assert ran.code == 8, ran.err
    assert "==> doctor" in ran.err and "==> export" not in ran.err and "==> compile" not in ran.err, ran.err
    assert "[dims.batch] pad = true, but the model is not batch-independent" in ran.err
    assert "case batch=2 padded to 3: output 'features'" in ran.err
    assert "remove 'pad = true' from [dims.batch]" in ran.err
    assert dirs.leftovers() == []


def test_external_weights_are_shared_by_every_size_and_swapped_in_all(tmp_path_factory):
    dirs, ran = build(EXTERNAL, tmp_path_factory.mktemp("static-external"))
    assert ran.code == 0, ran.err
    manifest, names = wheel_manifest(dirs, "model_tiny_static_external")
    assert [n for n in names if n.endswith(".safetensors") and "golden" not in n] == [
        "model_tiny_static_external/weights.safetensors"
    ]
    weights = load_file(str(dirs.build / "tiny_static_external" / "0.1" / "cpu" / "weights.safetensors"))
    with zipfile.ZipFile(next(dirs.dist.glob("*.whl"))) as archive:
        libraries = {n: archive.read(n) for n in names if n.endswith(".so")}
    assert sorted(libraries) == [
        "model_tiny_static_external/artifacts/batch2/model.so",
        "model_tiny_static_external/artifacts/model.so",
    ]
    for name, data in libraries.items():  # no .so embeds the weights: their bytes are in no library
        for tensor_name in ("conv.weight", "head.weight", "time.weight"):
            assert weights[tensor_name].numpy().tobytes() not in data, (name, tensor_name)
    python = make_venv(tmp_path_factory.mktemp("static-external-venv") / "env")
    pip_install(python, str(next(dirs.dist.glob("*.whl"))))
    generator = torch.Generator().manual_seed(3)
    tuned = {k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
    tuned_file = tmp_path_factory.mktemp("tuned") / "tuned.safetensors"
    save_file(tuned, str(tuned_file))
    code = f"""
import json, sys, torch, model_tiny_static_external as m
out = {{}}
for how in ("load", "swap"):
    model = m.load(weights={str(tuned_file)!r}) if how == "load" else m.load()
    if how == "swap":
        model.swap_weights({str(tuned_file)!r})
    for batch in (1, 2):
        x, t = m.example_inputs(seed=5, batch=batch)
        out[f"{{how}}{{batch}}"] = [model.route(batch), model(x, t)[1].tolist()]
json.dump(out, sys.stdout)
"""
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    module = load_model(load_spec(EXTERNAL)).module
    module.load_state_dict(tuned)
    spec_inputs = [i.model_dump(exclude_none=True) for i in load_spec(EXTERNAL).spec.inputs]
    for how in ("load", "swap"):
        assert got[f"{how}2"][0] == "static batch=2" and got[f"{how}1"][0] == "dynamic"
        for batch in (1, 2):
            with torch.no_grad():
                _, logits = module(*_inputs.make_inputs(spec_inputs, {"batch": batch}, 5))
            torch.testing.assert_close(torch.tensor(got[f"{how}{batch}"][1]), logits, rtol=1e-4, atol=1e-4)


def test_static_sizes_enter_the_cache_keys(tmp_path):
    """The whole-build key (content hash) and each size's compile key differ with the sizes."""
    from pipeline.stages.compile import plan_compile
    from pipeline.stages.export import content_hash, prepare
    from pipeline.stages.static import fixed_spec

    ours = load_spec(SPEC)
    other = load_spec(spec_with(tmp_path, "[dims.batch]\nmin = 1\nmax = 4\nstatic = [3]\npad = true"))
    loaded = load_model(ours)
    assert content_hash(ours, loaded) != content_hash(other, loaded)
    keys = {
        size: plan_compile(prepare(fixed_spec(ours, "batch", size), loaded, targets.get("cpu")), "g++ 12", tmp_path).key
        for size in (2, 3)
    }
    dynamic = plan_compile(prepare(ours, loaded, targets.get("cpu")), "g++ 12", tmp_path).key
    assert len({keys[2], keys[3], dynamic}) == 3
    assert (
        fixed_spec(ours, "batch", 3).spec.inputs[0].shape == [3, 3, 8, 8]
        and "batch" not in fixed_spec(ours, "batch", 3).spec.dims
    )
