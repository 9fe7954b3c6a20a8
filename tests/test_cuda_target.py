"""The CUDA target's parts that run without a GPU: refusals, the facts a CUDA wheel records and
checks, its label and index, and the spec keys. What needs a GPU is in test_cuda_gpu.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from pipeline import targets
from pipeline.commands.index_client import Index
from pipeline.errors import SpecError, TargetUnavailableError
from pipeline.services.templates import RUNTIME_DIR
from pipeline.spec import load_spec
from pipeline.spec_sections import Tolerance as SpecTolerance
from pipeline.stages.manifest import local_label
from pipeline.stages.verify_cases import applied_tolerances
from pipeline.targets import cuda
from pipeline.wheel_template.runtime import _target_cuda as wheel_cuda
from pipeline.wheel_template.runtime import _targets as wheel_targets

from .conftest import TINY_SPEC, run_cli

# What a wheel built on an H100 with torch 2.11.0+cu130 records (shared/design-notes.md).
H100 = {
    "torch": {"version": "2.11.0+cu130", "distribution": "2.11.0", "cuda": "13.0"},
    "cuda": {**wheel_cuda.requirements("13.0", (9, 0)), "gpu": "NVIDIA H100 80GB HBM3", "multi_arch": False},
}
GOOD_FACTS = {
    "torch_cuda": "13.0",
    "device": "cuda:0",
    "device_count": 1,
    "gpu": "NVIDIA H100 80GB HBM3",
    "capability": (9, 0),
    "driver_cuda": 13000,
}


def problems(manifest=H100, **changed):
    return wheel_cuda.problems(manifest, **(GOOD_FACTS | changed))


def test_requirements_record_what_the_kernels_need():
    needs = wheel_cuda.requirements("13.0", (9, 0))
    assert needs == {
        "version": "13.0",
        "capability": "9.0",
        "arch": "sm_90",
        "min_driver": "580.65.06",
        "min_driver_cuda": 13000,
    }
    assert wheel_cuda.requirements("12.8", (8, 6))["min_driver"] == "525.60.13"


def test_a_matching_gpu_has_no_problems():
    assert problems() == []


def test_cpu_only_torch_is_refused_naming_the_torch_the_wheel_needs():
    [found] = problems(torch_cuda=None)
    assert "CPU-only build" in found and "torch 2.11.0+cu130 with CUDA 13.0" in found


def test_a_torch_on_another_cuda_is_refused_naming_both():
    [found] = problems(torch_cuda="12.8")
    assert "torch runs CUDA 12.8" in found and "built with CUDA 13.0" in found


def test_no_visible_gpu_and_a_missing_device_are_refused():
    assert "no CUDA device is visible" in problems(device_count=0)[0]
    [found] = problems(device="cuda:1")
    assert "cuda:1 does not exist: 1 CUDA device(s) visible (cuda:0 to cuda:0)" in found


def test_an_old_driver_is_refused_naming_both_versions():
    [found] = problems(driver_cuda=12080)
    assert "driver supports CUDA 12.8" in found and "needs a driver for CUDA 13.x (>= 580.65.06)" in found
    assert "no NVIDIA driver library" in problems(driver_cuda=None)[0]


def test_another_compute_capability_is_refused_unless_ptx_ships():
    [older] = problems(capability=(8, 0), gpu="NVIDIA A100")
    assert "cuda:0 (NVIDIA A100) has compute capability 8.0" in older and "for 9.0 (sm_90" in older
    assert "multi_arch = true" in older
    [newer] = problems(capability=(10, 0))
    assert "compute capability 10.0" in newer
    with_ptx = {**H100, "cuda": {**H100["cuda"], "multi_arch": True}}
    assert problems(with_ptx, capability=(10, 0)) == []
    [still_older] = problems(with_ptx, capability=(8, 0))  # PTX runs on newer GPUs, not older ones
    assert "multi_arch" not in still_older


def test_variant_label_and_index_follow_pytorch(monkeypatch):
    assert wheel_cuda.variant("13.0") == "cu130" and wheel_cuda.variant("12.8") == "cu128"
    with pytest.raises(ValueError, match="CUDA build of torch"):
        wheel_cuda.variant(None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    public = torch.__version__.split("+")[0]
    assert local_label("cuda") == f"cu130.torch{public}" and local_label("cpu") == f"cpu.torch{public}"
    # The manifest records the variant; a wheel from before it, its version's local label.
    assert wheel_targets.variant({"variant": "cu130"}) == "cu130" and wheel_targets.variant({"variant": "cpu"}) == "cpu"
    assert wheel_targets.variant({"full_version": "1.3+cu130.torch2.11.0"}) == "cu130"
    index = Index(upload="http://localhost:8080/", simple="http://localhost:8080/{target}/simple/")
    assert index.upload_url("cu130") == "http://localhost:8080/cu130/"
    assert index.simple_url("cu130") == "http://localhost:8080/cu130/simple/"


def test_shipped_files_are_the_library_and_its_kernels():
    options = cuda.compile_options(load_spec(TINY_SPEC).spec)
    assert options == {cuda.EMBED_OPTION: False, cuda.MULTI_ARCH_OPTION: False, "freezing": True}
    names = ["model.so", "k0.cubin", "k1.fatbin", "k2.ptx", "model.wrapper.cpp", "k0.json", "model_consts.weights"]
    assert [n for n in names if cuda.ships(Path(n), options)] == ["model.so", "k0.cubin", "k1.fatbin", "k2.ptx"]
    embedded = {cuda.EMBED_OPTION: True}
    assert [n for n in names if cuda.ships(Path(n), embedded)] == ["model.so"]


def test_resolve_device():
    assert wheel_cuda.resolve_device("cuda:1") == "cuda:1"
    assert wheel_cuda.resolve_device(None) == "cuda:0"  # no GPU here: the current device is 0
    for bad in ("cpu", "cuda:x", "gpu:0"):
        with pytest.raises(ValueError, match="runs on CUDA devices"):
            wheel_cuda.resolve_device(bad)


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_cpu_only_torch_cannot_build_cuda():
    reason = cuda.unavailable()
    assert reason and "CPU-only build" in reason
    with pytest.raises(TargetUnavailableError, match="cannot build target 'cuda' here") as caught:
        targets.require_available(["cpu", "cuda"])
    assert "--target cpu" in caught.value.hint


@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch")
def test_target_cuda_is_refused_before_anything_is_written(dirs):
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--target", "cuda", *dirs.args(), timeout=60)
    assert ran.code == TargetUnavailableError.exit_code, ran.err
    assert "error: cannot build target 'cuda' here: torch" in ran.err and "CPU-only build" in ran.err
    assert "Traceback" not in ran.err
    assert dirs.leftovers() == [] and not dirs.build.exists()


def test_spec_cuda_keys(tmp_path):
    text = TINY_SPEC.read_text()
    plain = load_spec(TINY_SPEC)
    assert plain.spec.build.cuda.embed_kernels is False
    # Keys at their defaults leave the spec's serialised form (and so every cache key) as it was.
    assert "cuda" not in plain.spec.model_dump()["build"]
    assert "cuda" not in plain.spec.model_dump()["outputs"][0]
    spec = tmp_path / "spec.toml"
    spec.write_text(
        text
        + textwrap.dedent("""
        [build.cuda]
        embed_kernels = true
        multi_arch = true
        """)
    )
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    loaded = load_spec(spec).spec
    assert loaded.build.cuda.embed_kernels and loaded.build.cuda.multi_arch
    spec.write_text(text + "\n[build.cuda]\nembed = true\n")
    ran = run_cli("build", "--spec", str(spec), "--target", "cpu", "--dist", str(tmp_path / "dist"), timeout=60)
    assert ran.code == SpecError.exit_code and "build.cuda.embed" in ran.err


def test_per_target_tolerances_say_where_they_came_from():
    outputs = load_spec(TINY_SPEC).spec.outputs
    first = outputs[0].model_copy(update={"rtol": 1e-4, "atol": None, "cuda": SpecTolerance(atol=2e-3)})
    on_cuda = applied_tolerances([first], ("float32",), "cuda")[first.name]
    assert (on_cuda.rtol, on_cuda.rtol_from) == (1e-4, "outputs[0]")
    assert (on_cuda.atol, on_cuda.atol_from) == (2e-3, "outputs[0].cuda")
    on_cpu = applied_tolerances([first], ("float32",), "cpu")[first.name]
    assert on_cpu.atol_from == "default for float32" and on_cpu.rtol == 1e-4


def test_preload_makes_libstdcxx_global():
    """After load_cxx_runtime() a C++ runtime symbol resolves from the process's global scope, as
    a .so opened later binds to it (a bare python does not link libstdc++)."""
    probe = textwrap.dedent(f"""
        import ctypes, importlib.util
        def global_has(name):
            try:
                getattr(ctypes.CDLL(None), name)
                return True
            except AttributeError:
                return False
        before = global_has("_ZSt4cout")
        spec = importlib.util.spec_from_file_location("_preload", {str(RUNTIME_DIR / "_preload.py")!r})
        module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
        module.load_cxx_runtime(); module.load_cxx_runtime()
        print(before, global_has("_ZSt4cout"))
        """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]


def test_a_forward_that_makes_a_cpu_tensor_is_told_to_make_it_on_the_inputs_device(tmp_path, monkeypatch):
    """On an H200 the tiny model's timestep embedding (torch.arange without device=) met CUDA inputs;
    the hint spoke of shapes and dtypes. Here the meta device stands in for the GPU: the same
    forward, on inputs that are not on the CPU, raises a real device mismatch."""
    from types import SimpleNamespace

    from pipeline.errors import ExportError
    from pipeline.stages.export import prepare
    from pipeline.stages.loader import load_model

    # its own module name, and sys.path and sys.modules restored: later tests import the real tiny_model
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "arange_on_cpu", raising=False)
    (tmp_path / "spec.toml").write_text(TINY_SPEC.read_text().replace('"tiny_model:', '"arange_on_cpu:'))
    source = (TINY_SPEC.parent / "tiny_model.py").read_text()
    (tmp_path / "arange_on_cpu.py").write_text(source.replace(", device=t.device)", ")"))
    spec_file = load_spec(tmp_path / "spec.toml")
    try:
        with pytest.raises(ExportError) as refused:
            prepare(spec_file, load_model(spec_file), SimpleNamespace(TORCH_DEVICE="meta"))
    finally:
        sys.modules.pop("arange_on_cpu", None)
    assert "arange_on_cpu.py:20: angles = t[:, None] * freqs[None, :]" in refused.value.args[0]
    assert refused.value.hint.startswith(
        "forward makes a tensor on another device than its inputs' (meta): create it "
        "on an input's device (torch.arange(..., device=x.device))"
    )


def test_freezing_is_the_cuda_targets_default_where_the_weights_are_embedded(tmp_path):
    from pipeline.spec import with_overrides
    from pipeline.stages.static import fixed_spec

    tiny = load_spec(TINY_SPEC)  # says nothing of freezing
    assert cuda.compile_options(tiny.spec)["freezing"] is True
    assert "freezing" not in targets.get("cpu").compile_options(tiny.spec)  # the cpu target keeps the spec's False
    # the spec validated again (--version, a static size's fixed spec) still leaves it to the target
    assert cuda.compile_options(with_overrides(tiny, version="0.2").spec)["freezing"] is True
    assert cuda.compile_options(fixed_spec(tiny, "batch", 2).spec)["freezing"] is True
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text().replace("[compile]\n", "[compile]\nfreezing = false\n"))
    assert "freezing" not in cuda.compile_options(load_spec(spec).spec)  # the spec's own word wins
    external = TINY_SPEC.parent / "external.toml"
    assert "freezing" not in cuda.compile_options(load_spec(external).spec)  # swappable weights stay unfrozen


def test_freezing_external_weights_is_refused_plainly(tmp_path):
    """It used to crash verification with a KeyError for the first frozen constant (_frozen_param5)."""
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    spec = tmp_path / "spec.toml"
    spec.write_text(
        (TINY_SPEC.parent / "external.toml").read_text().replace("[compile]\n", "[compile]\nfreezing = true\n")
    )
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert info.value.message == (
        f"{spec}: invalid spec\n  key 'compile.freezing': cannot be used with [weights] external = true "
        "(freezing folds the weights into the compiled code, so load(weights=...) and swap_weights() "
        "could no longer replace them); "
        "remove one of them"
    )
