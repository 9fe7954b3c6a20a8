"""A third target is one file on each side. The tests' fake target (tests/targets/fake.py and its
runtime module _target_fake.py), registered as an installed package registers one, goes through
the spec, the command line, the release matrix, the build, the manifest and the installed
wheel's runtime, with no file of pipeline/ or templates/ naming it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO, TINY_SPEC, BuildDirs, make_venv, pip_install, run_cli

TARGETS_DIR = REPO / "tests" / "targets"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict[str, str]:
    """The environment of a process where a package registers the fake target (an entry point in
    a dist-info folder on its path, as pip would install it)."""
    site = tmp_path_factory.mktemp("site")
    info = site / "modelwheel_fake_target-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modelwheel-fake-target\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[modelwheel.targets]\nfake = fake\n")
    return {"PYTHONPATH": os.pathsep.join([str(TARGETS_DIR), str(site)])}


def fake_spec(folder: Path) -> Path:
    shutil.copytree(TINY_SPEC.parent, folder)
    spec = folder / "spec.toml"
    text = spec.read_text().replace(
        "[dims.batch]", '[build]\ntargets = ["fake"]\n\n[build.fake]\nlabel = "fromspec"\n\n[dims.batch]'
    )
    spec.write_text(
        text.replace("rtol = 1e-4\natol = 1e-5\n", "rtol = 1e-4\natol = 1e-5\n[outputs.fake]\natol = 3e-5\n")
    )
    return spec


@pytest.fixture(scope="module")
def fake_build(tmp_path_factory, plugin) -> tuple[BuildDirs, Path]:
    base = tmp_path_factory.mktemp("fake")
    spec = fake_spec(base / "spec")
    dirs = BuildDirs(root=base / "opt", dist=base / "dist", build=base / "build")
    ran = run_cli("build", "--spec", str(spec), *dirs.args(), "--fake-label", "fromflag", env=plugin)
    assert ran.code == 0, ran.err
    [wheel] = dirs.dist.glob("*.whl")
    return dirs, wheel


def test_the_registry_lists_the_installed_target_everywhere_names_are_listed(tmp_path, plugin):
    bad = run_cli("build", "--spec", str(TINY_SPEC), "--target", "nope", env=plugin)
    assert bad.code != 0 and "invalid choice: 'nope' (choose from 'cpu', 'cuda', 'fake')" in bad.err
    spec = fake_spec(tmp_path / "spec")
    matrix = run_cli("matrix", "--spec", str(spec), env=plugin)
    assert matrix.code == 0, matrix.err
    [job] = json.loads(matrix.out)["include"]
    assert job["target"] == "fake" and job["runner"] == ["self-hosted", "fake-accelerator"]
    assert (
        job["container"] == "registry.example.org/fake-builder:1" and job["container_options"] == "--device /dev/fake0"
    )


def test_without_the_package_the_target_is_unknown_to_the_spec(tmp_path):
    ran = run_cli("matrix", "--spec", str(fake_spec(tmp_path / "spec")))
    assert ran.code != 0
    assert "key 'build.targets': unknown target 'fake': choose from cpu, cuda" in ran.err


def test_the_target_checks_its_own_spec_section(tmp_path, plugin):
    spec = fake_spec(tmp_path / "spec")
    spec.write_text(spec.read_text().replace('label = "fromspec"', 'label = "Not A Word"\ncolour = "red"'))
    ran = run_cli("matrix", "--spec", str(spec), env=plugin)
    assert ran.code != 0
    assert "key 'build.fake.label'" in ran.err and "key 'build.fake.colour'" in ran.err


def test_the_wheel_records_the_target_and_ships_its_runtime_module(fake_build):
    _, wheel = fake_build
    assert re.match(r"model_tiny-0\.1\+fake\.torch[\d.]+-py3-none-manylinux_2_\d+_x86_64\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("model_tiny/manifest.json"))
    assert "model_tiny/_target_fake.py" in names and "model_tiny/_target_cpu.py" not in names
    assert (manifest["target"], manifest["device"], manifest["variant"]) == ("fake", "fake", "fake")
    # none of the CPU's facts: the runtime's shared gate must not need them (the install test loads it)
    assert not {"vec_isa", "cpu_capability", "onednn_max_isa"} & set(manifest["platform"]), manifest["platform"]
    assert manifest["fake"] == {"label": "fromflag"}  # the target's flag over its spec section
    logits = next(o for o in manifest["outputs"] if o["name"] == "logits")
    assert (logits["rtol"], logits["atol"]) == (1e-4, 3e-5)  # [outputs.fake] over [[outputs]]
    report = json.loads(wheel.with_name(wheel.name.split("-py3-")[0] + ".report.json").read_text())
    assert report["verification"]["reference"] == "eager, on the fake device"


def test_the_installed_wheel_opens_its_model_through_its_target_module(tmp_path, fake_build):
    _, wheel = fake_build
    python = make_venv(tmp_path / "env")
    pip_install(python, str(wheel))
    script = (
        "import sys, model_tiny\n"
        "model = model_tiny.load(device='fake')\n"
        "out = model(*model_tiny.example_inputs(batch=2))\n"
        "from model_tiny import _target_fake\n"
        "print(len(_target_fake.OPENED), model.device, [tuple(o.shape) for o in out])\n"
        "model_tiny.verify(model)\n"
        "try:\n    model_tiny.load_numpy()\nexcept model_tiny.NativeRuntimeError as e:\n    print('numpy:', e)\n"
    )
    ran = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd="/", timeout=300)
    assert ran.returncode == 0, ran.stderr
    first, numpy = ran.stdout.splitlines()
    assert first.startswith("1 cpu [(2, "), first  # opened once, by _target_fake.py, on the host
    assert "is a FAKE build; load_numpy() runs CPU builds only" in numpy
    # what the runtime refuses, its target module says (here: a label the fake device refuses)
    manifest_file = Path(
        subprocess.run(
            [
                str(python),
                "-c",
                "import model_tiny, pathlib; print(pathlib.Path(model_tiny.__file__).with_name('manifest.json'))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    manifest_file.write_text(manifest_file.read_text().replace('"label": "fromflag"', '"label": "refused"'))
    refused = subprocess.run(
        [str(python), "-c", "import model_tiny; model_tiny.load()"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert refused.returncode != 0 and "the fake device refuses the label 'refused'" in refused.stderr, refused.stderr


def test_a_wheels_platform_facts_are_checked_by_its_targets_type_and_only_the_cpus_has_cpu_keys():
    """The manifest's shared Platform names no CPU fact (mypy refuses a read of one outside the CPU's
    runtime module); a CPU wheel's load checks its own (_target_cpu.py's PLATFORM), and a wheel of
    another target keeps such a key unchecked, as any key its type does not name."""
    from typing import get_type_hints

    from pipeline.wheel_template.runtime import _schema, _targets

    assert set(get_type_hints(_schema.Platform)) == {"machine", "glibc"}
    facts = {"machine": "x86_64", "glibc": "2.28", "cpu_capability": 2}
    found = {}
    for name in ("cpu", "cuda", "fake"):
        manifest = {"target": name, "platform": facts}
        found[name] = [p for p in _schema.problems(manifest, _targets.platform_type(manifest)) if "platform" in p]
    assert found == {"cpu": ["platform.cpu_capability: expected str, got int"], "cuda": [], "fake": []}


def test_no_file_outside_the_target_files_names_a_target():
    found = subprocess.run(
        ["grep", "-rnE", r'"(cuda|cpu)"', "pipeline", "templates"], cwd=REPO, capture_output=True, text=True
    ).stdout.splitlines()
    allowed = (
        "pipeline/targets/cpu.py",
        "pipeline/targets/cuda.py",
        "templates/wheel/runtime/_target_cpu.py",
        "templates/wheel/runtime/_target_cuda.py",
    )
    outside = [line for line in found if not line.startswith(allowed) and '"""' not in line and "``" not in line]
    assert outside == [], "\n".join(outside)


def test_make_bench_asks_the_registry_for_the_target_it_measures(plugin):
    ran = subprocess.run(
        ["make", "-n", "--no-print-directory", "bench", "TARGET=fake", "USE_VENV=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    assert "-m benchmarks --target fake --spec models/unet/spec.toml" in ran.stdout, ran.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--target", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **plugin},
    )
    assert refused.returncode != 0 and "(choose from 'cpu', 'cuda', 'fake')" in refused.stderr, refused.stderr
    from benchmarks.__main__ import bench_module

    assert (bench_module("cuda"), bench_module("fake")) == ("benchmarks.bench_cuda", "benchmarks.bench")


def test_the_benchmarks_name_no_target_but_their_own():
    """A target's name is the registry's to give: only a bench of the target's own
    (benchmarks/bench_<name>.py) names it."""
    names = "|".join(("cpu", "cuda"))
    found = subprocess.run(
        ["grep", "-rnE", rf'(get\(|target=|DEVICE [!=]= ?)"({names})"', "benchmarks", "Makefile"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    outside = [line for line in found if not re.match(rf"benchmarks/bench_({names})\.py:", line)]
    assert outside == [], "\n".join(outside)
    assert "ifeq ($(TARGET)" not in (REPO / "Makefile").read_text()
