"""A CUDA wheel's packaging, link, runtime refusal, cubin_dir and index, without a GPU: the tiny
model's real CPU .so stands in for the CUDA one, with fabricated .cubin kernel files beside it.
What only a GPU can show (the kernels running) is in test_cuda_gpu.py."""

from __future__ import annotations

import email
import json
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest
import torch

from pipeline.services.manifest import sha256_file
from pipeline.stages.compile import _move_sources
from pipeline.stages.package import package_wheel
from pipeline.wheel_template.runtime import _target_cuda as wheel_cuda

from .conftest import make_venv, pip_install, run_cli

KERNELS = {"c1xq2kcz3.cubin": b"\x7fELF fabricated kernel one", "cv4hbb7z.cubin": b"\x7fELF fabricated kernel two"}


def test_only_the_library_and_kernels_stay_in_the_output_folder(tmp_path):
    output, sources = tmp_path / "out", tmp_path / "sources"
    output.mkdir()
    for name in [
        "model.so",
        *KERNELS,
        "k.ptx",
        "k.fatbin",
        "model.wrapper.cpp",
        "model_metadata.json",
        "model.kernel.cpp",
    ]:
        (output / name).write_bytes(b"x")
    (output / "cxk2").mkdir()
    shipped = _move_sources(output, sources, "cuda", {"aot_inductor.embed_kernel_binary": False})
    assert [p.name for p in shipped] == sorted(["c1xq2kcz3.cubin", "cv4hbb7z.cubin", "k.fatbin", "k.ptx", "model.so"])
    assert sorted(p.name for p in sources.iterdir()) == [
        "cxk2",
        "model.kernel.cpp",
        "model.wrapper.cpp",
        "model_metadata.json",
    ]


def cuda_manifest(cpu: dict, opt_path: Path, artifacts: list[Path]) -> dict:
    """The CPU wheel's manifest as the cuda target writes it for an H100 build with torch's CUDA 13.0."""
    public = cpu["torch"]["version"].split("+")[0]
    return {
        **cpu,
        "target": "cuda",
        "variant": "cu130",
        "full_version": f"{cpu['version']}+cu130.torch{public}",
        "torch": {**cpu["torch"], "cuda": "13.0"},
        "platform": {"machine": cpu["platform"]["machine"], "glibc": cpu["platform"]["glibc"]},
        "cuda": {
            **wheel_cuda.requirements("13.0", (9, 0)),
            "gpu": "NVIDIA H100 80GB HBM3",
            "triton": "3.6.0",
            "embed_kernels": False,
            "multi_arch": False,
            "kernels": sorted(KERNELS),
        },
        "opt_path": str(opt_path),
        "relocatable": False,
        "artifacts": {p.name: {"sha256": sha256_file(p), "size": p.stat().st_size} for p in artifacts},
    }


@pytest.fixture(scope="module")
def cuda_wheel(tmp_path_factory, wheel) -> tuple[Path, dict, Path]:
    base = tmp_path_factory.mktemp("cuda-packaging")
    with zipfile.ZipFile(wheel) as archive:
        cpu = json.loads(archive.read("model_tiny/manifest.json"))
        archive.extract(f"model_tiny/artifacts/{cpu['library']}", base / "cpu")
        archive.extract(f"model_tiny/{cpu['golden']['file']}", base / "cpu")
    library = base / "cpu" / "model_tiny" / "artifacts" / cpu["library"]
    kernels = []
    for name, data in KERNELS.items():
        (base / name).write_bytes(data)
        kernels.append(base / name)
    m = cuda_manifest(cpu, base / "opt" / "tiny" / "0.1" / "cuda", [library, *kernels])
    built = package_wheel(m, [library, *kernels], [base / "cpu" / "model_tiny" / cpu["golden"]["file"]], base / "work")
    return built.path, m, base


def test_wheel_is_labelled_for_its_cuda_and_carries_every_kernel(cuda_wheel):
    path, m, _ = cuda_wheel
    assert path.name.startswith(f"model_tiny-0.1+cu130.torch{torch.__version__.split('+')[0]}-py3-none-manylinux_2_")
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        assert {f"model_tiny/artifacts/{k}" for k in KERNELS} <= names
        for kernel, data in KERNELS.items():
            assert archive.read(f"model_tiny/artifacts/{kernel}") == data
        assert json.loads(archive.read("model_tiny/manifest.json"))["cuda"]["kernels"] == sorted(KERNELS)


def test_the_build_summary_names_link_for_a_wheel_that_loads_from_its_opt_path(cuda_wheel, wheel):
    """A CUDA wheel loads from its /opt path (`model-x link` makes it); a CPU wheel loads from its
    package, so its summary leaves `link` out."""
    from pipeline.services.manifest import read_wheel_manifest
    from pipeline.summary import usage_lines

    assert "  command   model-tiny verify | info | link  (installed with the wheel)" in usage_lines(
        cuda_wheel[0], read_wheel_manifest(cuda_wheel[0])
    )
    assert "  command   model-tiny verify | info  (installed with the wheel)" in usage_lines(
        wheel, read_wheel_manifest(wheel)
    )


def test_the_build_summary_offers_load_numpy_only_where_the_target_runs_it(cuda_wheel, wheel):
    """load_numpy()'s C interface runs host models only: a CUDA build's summary offered it (H200)."""
    from pipeline.services.manifest import read_wheel_manifest
    from pipeline.summary import usage_lines

    cuda_lines = usage_lines(cuda_wheel[0], read_wheel_manifest(cuda_wheel[0]))
    assert "  import    import model_tiny; model = model_tiny.load()" in cuda_lines
    cpu_lines = usage_lines(wheel, read_wheel_manifest(wheel))
    numpy_too = "  (or load_numpy(), example_arrays(): no torch import)"
    assert f"  import    import model_tiny; model = model_tiny.load(){numpy_too}" in cpu_lines
    # and the wheel's README (its METADATA's description) likewise
    readme = {name: _description(built) for name, built in (("cuda", cuda_wheel[0]), ("cpu", wheel))}
    assert "load_numpy" not in readme["cuda"]
    assert "`model = model_tiny.load_numpy()`, then `outputs = model(*model_tiny.example_arrays())`" in readme["cpu"]


def _description(wheel) -> str:
    """The wheel's README, as its METADATA carries it."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(metadata)).get_payload()


def test_the_build_summary_lists_many_kernels_in_one_line():
    """A CUDA build listed its 78 kernels one per line, each '0.0 MB'."""
    from pipeline.summary import artifact_lines

    artifacts = {"model.so": {"size": 94_400_000}} | {f"k{i}.cubin": {"size": 20_000} for i in range(78)}
    artifacts |= {"a.ptx": {"size": 1_000}, "b.ptx": {"size": 2_000}}
    mb = lambda n: f"{n / 1e6:.1f} MB"  # noqa: E731
    assert artifact_lines(artifacts, mb) == [
        "  artifact  model.so  94.4 MB",
        "  artifact  78 .cubin files  1.6 MB in all",
        "  artifact  a.ptx  0.0 MB",
        "  artifact  b.ptx  0.0 MB",
    ]


def test_its_readme_names_pytorchs_index_for_its_cuda(cuda_wheel):
    """The wheel pins a CUDA torch (`+cu130`) that only PyTorch's cu130 index carries: its README says so."""
    description = _description(cuda_wheel[0])
    lines = [line.strip() for line in description.splitlines() if line.strip().startswith("pip install ")]
    assert lines == ["pip install model-tiny==0.1 --extra-index-url https://download.pytorch.org/whl/cu130"], lines
    assert "`--index-url <your index>/cu130/simple`" in description


@pytest.fixture(scope="module")
def cuda_installed(tmp_path_factory, cuda_wheel) -> Path:
    python = make_venv(tmp_path_factory.mktemp("cuda-venv") / "env")
    pip_install(python, str(cuda_wheel[0]))
    return python


def run_in(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd="/")


def test_installed_on_cpu_only_torch_load_refuses_naming_both_sides(cuda_installed):
    ran = run_in(cuda_installed, "import model_tiny; model_tiny.load()")
    assert ran.returncode != 0 and "IncompatibleRuntime" in ran.stderr
    assert (
        "the installed torch is a CPU-only build; the model needs torch" in ran.stderr
        and "with CUDA 13.0" in ran.stderr
    )
    numpy = run_in(cuda_installed, "import model_tiny; model_tiny.load_numpy()")
    assert numpy.returncode != 0 and "load_numpy() runs CPU builds only: use load()" in numpy.stderr


def test_link_exposes_the_kernels_at_the_recorded_path(cuda_installed, cuda_wheel):
    _, m, _ = cuda_wheel
    ran = subprocess.run([str(cuda_installed.parent / "model-tiny"), "link"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    opt_path = Path(m["opt_path"])
    assert opt_path.is_symlink() and sorted(p.name for p in opt_path.iterdir()) == sorted([m["library"], *KERNELS])


def test_runner_gets_the_installed_kernel_folder_as_cubin_dir(cuda_installed, cuda_wheel):
    """Wherever the .so is opened from (the /opt link here), cubin_dir is the package's own
    artifacts folder; libstdc++ is made global first. torch's CUDA runner cannot run without a
    GPU, so it is replaced by a recorder of its arguments in that one process."""
    _, m, _ = cuda_wheel
    code = (
        "import ctypes, pathlib, torch, model_tiny, model_tiny._load as load\n"
        "torch._C._aoti.AOTIModelContainerRunnerCuda = lambda *args: print(*args)\n"
        f"load._open_runner(model_tiny.manifest(), pathlib.Path({m['opt_path']!r}) / 'model.so', 'cuda:1', 2)\n"
        "getattr(ctypes.CDLL(None), '_ZSt4cout'); print('libstdc++ global')\n"
    )
    ran = run_in(cuda_installed, code)
    assert ran.returncode == 0, ran.stderr
    library, count, device, cubin_dir = ran.stdout.splitlines()[0].split()
    assert (library, count, device) == (f"{m['opt_path']}/model.so", "2", "cuda:1")
    assert cubin_dir.endswith("site-packages/model_tiny/artifacts") and Path(cubin_dir, next(iter(KERNELS))).is_file()
    assert ran.stdout.splitlines()[1] == "libstdc++ global"


def test_publish_sends_it_to_the_per_cuda_index(cuda_wheel, tmp_path):
    path, _, _ = cuda_wheel
    home = tmp_path / "index"
    home.mkdir()
    assert run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home).code == 0
    try:
        ran = run_cli("publish", "--without-report", "--wheel", str(path), cwd=home)  # packaged here, no build report
        assert ran.code == 0, ran.err
        assert f"{path.name}: uploaded to the cu130 index" in ran.err
        assert (home / "data" / "cu130" / path.name).is_file() and not list((home / "data").glob("cpu/*.whl"))
        state = json.loads((home / "build" / "index" / "state.json").read_text())
        page = urllib.request.urlopen(state["url"] + "cu130/simple/model-tiny/").read().decode()
        assert path.name in page
    finally:
        assert run_cli("index", "stop", cwd=home).code == 0
