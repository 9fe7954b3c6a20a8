"""A real build of the tiny model, installed with pip into a fresh virtualenv and run in new processes."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.spec import load_spec
from pipeline.stages import package
from pipeline.stages.loader import load_model

from .conftest import TINY_SPEC, Ran, attach_torch, copy_compiled, make_venv, pip_install, run_cli

RUNTIME_FORBIDDEN = ("torch._inductor", "torch._dynamo")


def run_in(python: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-W", "default", "-c", code], capture_output=True, text=True, env={**os.environ, **env}, cwd="/"
    )


def installed_package(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages/model_tiny"))


@contextlib.contextmanager
def altered(path: Path, change):
    """Apply ``change`` to an installed file, restoring the original bytes afterwards."""
    original = path.read_bytes()
    try:
        change(path, original)
        yield
    finally:
        path.write_bytes(original)


def manifest_of(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("model_tiny/manifest.json"))


def test_build_prints_stages_and_report(tiny_build, wheel):
    build_dirs, ran = tiny_build
    for stage in ("load", "doctor", "export", "compile", "verify", "package"):
        assert f"==> {stage}" in ran.err and f"    {stage} done in " in ran.err
    assert f"built {wheel.name}" in ran.err and "verified  logits: 10 cases, max abs diff" in ran.err
    report = json.loads((build_dirs.dist / "model_tiny-0.1+cpu.torch2.13.0.report.json").read_text())
    assert report["wheel"]["name"] == wheel.name and report["wheel"]["size"] == wheel.stat().st_size
    assert set(report["stages_s"]) == {"load", "doctor", "export", "compile", "verify", "package"}
    assert [c["case"] for c in report["verification"]["cases"]] == [
        "seed0",
        "seed1",
        "seed2",
        "batch=min(1)",
        "batch=mid(2)",
        "batch=max(4)",
        "zeros",
        "large",
        "golden0",
        "golden1",
    ]
    for case in report["verification"]["cases"]:
        assert set(case["outputs"]) == {"features", "logits"}
        assert all({"max_abs", "max_rel", "passed"} <= set(diff) for diff in case["outputs"].values())
    assert set(report["verification"]["worst"]) == {"features", "logits"}
    assert any(Path(report["trace_dir"]).iterdir()), "TORCH_TRACE output is kept with the build"
    assert sorted(p.name for p in build_dirs.dist.iterdir()) == sorted(
        [wheel.name, "model_tiny-0.1+cpu.torch2.13.0.report.json"]
    )
    # that the build leaves the artifact root as it found it is checked in the tiny_build fixture


def test_wheel_metadata_and_manifest(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read("model_tiny-0.1+cpu.torch2.13.0.dist-info/METADATA").decode()
        wheel_info = archive.read("model_tiny-0.1+cpu.torch2.13.0.dist-info/WHEEL").decode()
        so_bytes = archive.read("model_tiny/artifacts/model.so")
        entry_points = archive.read("model_tiny-0.1+cpu.torch2.13.0.dist-info/entry_points.txt").decode()
    assert f"Requires-Dist: torch=={importlib.metadata.version('torch')}" in metadata
    assert "Root-Is-Purelib: false" in wheel_info and "Tag: py3-none-manylinux_2_" in wheel_info
    assert "model-tiny = model_tiny._cli:main" in entry_points
    assert {"model_tiny/__init__.py", "model_tiny/_load.py", "model_tiny/_link.py", "model_tiny/manifest.json"} <= names
    manifest = manifest_of(wheel)
    assert manifest["torch"]["version"] == torch.__version__
    assert manifest["target"] == "cpu" and manifest["platform"]["cpu_capability"] in {"DEFAULT", "AVX2", "AVX512"}
    assert manifest["artifacts"]["model.so"] == {"sha256": hashlib.sha256(so_bytes).hexdigest(), "size": len(so_bytes)}
    assert manifest["content_hash"].startswith("sha256:")
    assert [o["name"] for o in manifest["outputs"]] == ["features", "logits"]
    assert manifest["outputs"][1]["rtol"] == 1e-4 and manifest["outputs"][1]["atol"] == 1e-5
    assert manifest["dims"] == {"batch": {"min": 1, "max": 4, "example": 2}}
    assert manifest["opt_path"].endswith("/tiny/0.1/cpu")


def test_wheel_is_lean_and_self_describing(tiny_build, wheel):
    """The .so ships without debug info, the package is marked typed, Requires-Python is what the
    pinned torch needs, and a spec without license or URLs adds neither."""
    build_dirs, _ = tiny_build
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read("model_tiny-0.1+cpu.torch2.13.0.dist-info/METADATA").decode()
        so_bytes = archive.read("model_tiny/artifacts/model.so")
    assert b".debug_info" not in so_bytes and len(so_bytes) < 800_000, len(so_bytes)  # 1.55 MB with debug info
    report = json.loads((build_dirs.dist / "model_tiny-0.1+cpu.torch2.13.0.report.json").read_text())
    assert report["debug_info"] == "stripped"
    assert "model_tiny/py.typed" in names
    torch_needs = importlib.metadata.metadata("torch")["Requires-Python"]
    assert f"Requires-Python: {torch_needs}" in metadata.splitlines(), metadata
    assert "License-Expression" not in metadata and "Project-URL" not in metadata
    assert manifest_of(wheel)["license"] is None and manifest_of(wheel)["urls"] == {}


@pytest.fixture(scope="module")
def variant_build(tmp_path_factory, tiny_build) -> Path:
    """One build of the tiny model's code with what comes after its compile changed: --keep-debug,
    a license and URLs, and an fp64 reference with one golden case and no edge cases. The compile
    options are the session build's, so its build cache (copied here, as ``warm_dirs`` does)
    gives the compiled .so as AOTInductor wrote it; stripping it or not, the metadata and the
    verification all run as in a fresh build. Returns its dist/."""
    base = tmp_path_factory.mktemp("variant")
    copy_compiled(tiny_build[0].build / "cache", base / "build" / "cache")
    (base / "src").mkdir()
    spec = base / "src" / "spec.toml"
    spec.write_text(
        TINY_SPEC.read_text().replace(
            'description = "Tiny test model"\n',
            'description = "Tiny test model"\nlicense = "apache-2.0 OR mit"\n'
            'urls = { Homepage = "https://example.com/tiny", "Source code" = "http://example.com/src?a=1&b=$x" }\n',
        )
        + "\n[verify]\nfp64_reference = true\nedge_cases = false\ngolden_cases = 1\n"
    )
    (base / "src" / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    ran = run_cli(
        "build",
        "--spec",
        str(spec),
        "--keep-debug",
        "--root",
        str(base / "opt"),
        "--dist",
        str(base / "dist"),
        "--build-dir",
        str(base / "build"),
    )
    assert ran.code == 0, ran.err
    return base / "dist"


def test_keep_debug_license_and_urls_reach_the_wheel(variant_build):
    (wheel,) = variant_build.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("model_tiny-0.1+cpu.torch2.13.0.dist-info/METADATA").decode().splitlines()
        so_bytes = archive.read("model_tiny/artifacts/model.so")
    assert b".debug_info" in so_bytes
    assert json.loads(next(variant_build.glob("*.report.json")).read_text())["debug_info"] == "kept"
    assert "License-Expression: Apache-2.0 OR MIT" in metadata
    assert "Project-URL: Homepage, https://example.com/tiny" in metadata
    assert "Project-URL: Source code, http://example.com/src?a=1&b=$x" in metadata


def test_missing_strip_is_named_before_compiling(tmp_path):
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        env={"STRIP": str(tmp_path / "no-such-strip")},
    )
    assert ran.code == 6, ran.err  # ToolchainError
    assert f"cannot run '{tmp_path / 'no-such-strip'}'" in ran.err
    assert "apt-get install binutils" in ran.err and "--keep-debug" in ran.err
    assert "==> compile" not in ran.err


def test_installed_wheel_matches_eager_in_a_new_process(installed, tmp_path, wheel):
    out = tmp_path / "outputs.pt"
    code = (
        "import sys, torch, model_tiny\n"
        "m = model_tiny.load()\n"
        "results = {}\n"
        "for batch in (1, 2, 4):\n"
        "    args = model_tiny.example_inputs(seed=batch, batch=batch)\n"
        "    results[batch] = (args, m(*args))\n"
        f"torch.save(results, {str(out)!r})\n"
        f"bad = [k for k in sys.modules if k.startswith({RUNTIME_FORBIDDEN!r})]\n"
        "print('compiler modules:', bad)\n"
        "print('heap:', model_tiny._malloc._outcome)\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0, ran.stderr
    assert "compiler modules: []" in ran.stdout, "the runtime must not import the compiler stack"
    assert "heap: kept" in ran.stdout, "load() keeps freed memory in the heap (_malloc.py)"
    assert "ArtifactLinkWarning" not in ran.stderr
    eager = load_model(load_spec(TINY_SPEC)).module
    tolerances = {o["name"]: o for o in manifest_of(wheel)["outputs"]}
    for batch, (args, compiled) in torch.load(out).items():
        with torch.no_grad():
            expected = eager(*args)
        for name, got, want in zip(("features", "logits"), compiled, expected):
            assert got.shape[0] == batch
            torch.testing.assert_close(got, want, rtol=tolerances[name]["rtol"], atol=tolerances[name]["atol"])


def test_load_numpy_matches_eager_without_importing_torch(installed, tmp_path):
    out = tmp_path / "outputs.npz"
    code = (
        "import sys, numpy as np, model_tiny\n"
        "m = model_tiny.load_numpy()\n"
        "rng = np.random.default_rng(0)\n"
        "x = rng.standard_normal((4, 3, 8, 8), dtype=np.float32)\n"
        "t = (rng.random(4) * 1000).astype(np.float32)\n"
        "features, logits = m(np.asfortranarray(x[:3]), t[:3])\n"  # a non-contiguous input is accepted
        "again = m(x, t)[1]\n"
        f"np.savez({str(out)!r}, x=x, t=t, features=features, logits=logits, again=again)\n"
        "print('torch imported:', 'torch' in sys.modules, type(logits).__name__, logits.flags['OWNDATA'])\n"
        "print('heap:', model_tiny._malloc._outcome)\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0, ran.stderr
    assert "torch imported: False ndarray" in ran.stdout, "load_numpy() must not import torch"
    assert "heap: kept" in ran.stdout, "load_numpy() keeps freed memory in the heap (_malloc.py)"
    saved = np.load(out)
    eager = load_model(load_spec(TINY_SPEC)).module
    with torch.no_grad():
        features, logits = eager(torch.from_numpy(saved["x"][:3]), torch.from_numpy(saved["t"][:3]))
        _, logits4 = eager(torch.from_numpy(saved["x"]), torch.from_numpy(saved["t"]))
    torch.testing.assert_close(torch.from_numpy(saved["features"]), features, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_numpy(saved["logits"]), logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(saved["again"]), logits4, rtol=1e-4, atol=1e-5)


def test_load_numpy_names_bad_arguments_and_refuses_a_lower_cpu(installed):
    code = (
        "import numpy as np, model_tiny\nm = model_tiny.load_numpy()\n"
        "x, t = np.zeros((2, 3, 8, 8), np.float32), np.zeros(2, np.float32)\n"
        "import torch\n"
        "for args in [(x,), (x[:, :2], t), (x, t[:1]), (x.astype(np.float64), t), (x.tolist(), t), "
        "(torch.from_numpy(x), t)]:\n"
        "    try:\n        m(*args)\n    except ValueError as e:\n        print(e)\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "expected 2 arrays (x, t), got 1",
        "input 'x': dim 1 must be 3, got 2",
        "input 't': dim 0 (batch) is 1, but input 'x' has batch=2",
        "input 'x': expected dtype float32, got float64",
        "input 'x': expected a numpy.ndarray, got list",
        "input 'x': expected a numpy.ndarray, got Tensor "
        "(a torch tensor: pass t.numpy(), make arrays with example_arrays(), or use load())",
    ]
    needed = json.loads(run_in(installed, "import model_tiny, json; print(json.dumps(model_tiny.manifest()))").stdout)
    if needed["platform"]["cpu_capability"] == "AVX512":  # ATen and load_numpy() both honour the variable
        lower = run_in(installed, "import model_tiny; model_tiny.load_numpy()", ATEN_CPU_CAPABILITY="avx2")
        assert lower.returncode != 0 and "IncompatibleRuntime" in lower.stderr
        assert (
            "torch runs AVX2 kernels here, as ATEN_CPU_CAPABILITY=avx2 asks, but the model's kernels were built "
            "for AVX512 CPUs"
        ) in lower.stderr


def test_info_says_a_search_that_compiled_no_other_candidate_and_why(wheel):
    """A newcomer's `model-unet info` said "no option search" for a build whose search ran and
    stopped on the noise before compiling a candidate; then it listed the candidates not tried
    without saying the noise had decided."""
    import zipfile

    from pipeline.wheel_template.runtime._info import summary

    with zipfile.ZipFile(wheel) as archive:
        manifest = json.loads(archive.read("model_tiny/manifest.json"))
    first = manifest["compile_search"]["candidates"][0]
    noisy = "cannot win beyond the noise measured before the compiles (the build's report has the spread)"
    not_tried = [{"name": name, "reason": noisy} for name in ("freezing", "max-autotune")]
    not_tried.append({"name": "bf16-autocast", "reason": "this CPU has no native bfloat16 instructions"})
    # a reason with figures (bf16's diffs, under autocast in a spec that sets it): said without them, not "…))"
    tolerances = "the output tolerances refuse it: case seed0: output 'y': max abs diff 0.02 (rtol 0.001, atol 0.0001)"
    not_tried.append({"name": "bf16-pinned", "reason": tolerances})
    manifest["compile_search"] = {"chosen": first["name"], "candidates": [first], "not_tried": not_tried}
    search = next(line for line in summary(manifest, Path("/x")) if line.startswith("  search    "))
    assert search == (
        f"  search    tried {first['name']} only; not tried: freezing, max-autotune (cannot win beyond the noise "
        "measured before the compiles); bf16-autocast (this CPU has no native bfloat16 instructions); "
        "bf16-pinned (the output tolerances refuse it)"
    ), search
    manifest["compile_search"]["candidates"] = [first, {**first, "name": "freezing"}]
    manifest["compile_search"]["not_tried"] = not_tried[1:]
    search = next(line for line in summary(manifest, Path("/x")) if line.startswith("  search    "))
    assert search.startswith(
        f"  search    kept {first['name']} (none faster beyond the timing noise) among {first['name']}, freezing; "
        "not tried: "
    ), search
    manifest["compile_search"]["chosen"] = "freezing"  # another won: chosen, as such
    search = next(line for line in summary(manifest, Path("/x")) if line.startswith("  search    "))
    assert search.startswith(f"  search    chose freezing among {first['name']}, freezing; not tried: "), search
    # what an option does, said only beside one that is on ("freezing False (the weights folded …)" misled)
    manifest["compile_options"] = {"cpp.dynamic_threads": True, "freezing": False, "max_autotune": True}
    compiled = next(line for line in summary(manifest, Path("/x")) if line.startswith("  compiled  "))
    assert compiled == (
        "  compiled  the freezing candidate's options: cpp.dynamic_threads True (the thread count read "
        "when it runs, not fixed at "
        "build time), freezing False, max_autotune True (each kernel chosen by timing several at build time)"
    ), compiled
    # kept (or the search off): the spec's own options, one phrasing for both
    manifest["compile_search"]["chosen"] = first["name"]
    compiled = next(line for line in summary(manifest, Path("/x")) if line.startswith("  compiled  "))
    assert compiled.startswith("  compiled  the spec's own options: cpp.dynamic_threads True"), compiled
    # no speed-up in it, and why: the wheel keeps no timing, so that a rebuild gives the same bytes
    assert search.endswith(
        "; its timings are in the build's summary and report (the wheel keeps none, so that a rebuild gives the "
        "same bytes)"
    ), search


def test_runs_with_only_torch_installed_and_names_what_is_missing(wheel, tmp_path):
    """numpy, safetensors and filelock are imported where they are used: with none installed (pip
    install --no-deps), import and load() work, and load_numpy() and verify name the package to
    install; with not even torch, `info` works and `verify` says how to get the torch it pins."""
    python = make_venv(tmp_path / "env", sees_torch=False)
    pip_install(python, "--no-deps", str(wheel))
    bare = run_in(python, "import model_tiny; print(model_tiny.__version__)")
    assert bare.returncode == 0 and bare.stdout.strip().startswith("0.1+cpu.torch"), bare.stderr
    version = bare.stdout.strip()
    info = subprocess.run([str(python.parent / "model-tiny"), "info", "--json"], capture_output=True, text=True)
    assert info.returncode == 0 and json.loads(info.stdout)["full_version"] == version, info.stderr
    # a screenful, not the manifest (162 lines for the unet): what it takes, gives, and how it was built
    said = subprocess.run([str(python.parent / "model-tiny"), "info"], capture_output=True, text=True, cwd="/")
    lines = said.stdout.splitlines()
    assert said.returncode == 0 and len(lines) <= 12, said.stdout + said.stderr
    assert lines[0] == f"model-tiny {version}: Tiny test model"
    assert "  inputs    x float32 [batch, 3, 8, 8]; t float32 [batch]" in lines
    assert "  dims      batch from 1 to 4 (example 2)" in lines
    assert (
        "  outputs   features float32 (rtol 0.0001, atol 0.0001); logits float32 (rtol 0.0001, atol 1e-05), "
        "returned as a tuple in this order"
    ) in lines
    # the build machine's glibc, said as such beside the manylinux tag's (a newcomer read 2.36 against 2_35)
    target = next(line for line in lines if line.startswith("  target    cpu, torch "))
    # which CPUs it runs on, in words: a newcomer's native build ran on AVX-512 CPUs only, and only the
    # target's cpu_capability said so
    assert any(
        re.fullmatch(r"  runs on   x86-64 CPUs with AVX(2|512), the build machine's kind \(native.*\)", line)
        for line in lines
    )
    # and the tag itself, from the installed wheel's WHEEL file (the manifest is written before auditwheel tags it)
    assert re.search(
        r", on glibc [\d.]+ \(its manylinux_(\d+)_(\d+) tag: it runs on glibc \1\.\2 and newer\)$", target
    ), target
    # the thread count Inductor planned for (8, on this 2-core machine) is said to be no mistake
    compiled = next(line for line in lines if line.startswith("  compiled  the spec's own options: "))
    assert (
        "cpp.threads 8 (the threads its loops are planned for, whatever the build machine had; it runs on " in compiled
    )
    assert "  search    off: the spec's options alone ([compile] search = false, or --no-search)" in lines
    assert (
        "  verified  10 cases against eager at build time: passed; `model-tiny verify` runs its 2 golden cases here"
    ) in lines
    assert lines[-1] == "the whole manifest, as JSON: model-tiny info --json"
    no_torch = subprocess.run([str(python.parent / "model-tiny"), "verify"], capture_output=True, text=True)
    assert no_torch.returncode == 6 and "Traceback" not in no_torch.stderr, no_torch.stderr
    assert no_torch.stderr == (
        f"error: model-tiny verify needs torch, which is not installed here: pip install "
        f"model-tiny=={version} again, without --no-deps, for the torch it pins\n"
    )
    attach_torch(python)  # this suite's torch, as `pip install torch==<the pin>` gives it (torch brings filelock)
    assert run_in(python, "import numpy").returncode != 0 and run_in(python, "import safetensors").returncode != 0
    ran = run_in(python, "import model_tiny; m = model_tiny.load(); print(m(*model_tiny.example_inputs())[1].shape)")
    assert ran.returncode == 0, ran.stderr
    assert "torch.Size([2, 4])" in ran.stdout
    numpy = run_in(
        python,
        "import model_tiny\ntry:\n    model_tiny.load_numpy()\nexcept model_tiny.MissingDependency as e:\n    print(e)",
    )
    assert numpy.returncode == 0, numpy.stderr
    assert (
        numpy.stdout.strip() == "load_numpy() (numpy arrays in and out) needs the package numpy, which is not "
        "installed here: pip install numpy"
    )
    cli = subprocess.run([str(python.parent / "model-tiny"), "verify"], capture_output=True, text=True)
    assert cli.returncode == 6, cli.stdout + cli.stderr
    # (torch itself warns first, on import, that it found no numpy)
    assert (
        "error: verify() (reading the golden cases) needs the package safetensors, which is not installed here: "
        "pip install safetensors"
        in cli.stderr
        and "Traceback" not in cli.stderr
    )


@pytest.mark.parametrize("loader", ["load", "load_numpy"])
def test_call_names_its_inputs_and_outputs(installed, loader):
    """The call's signature and help() name the inputs and outputs; outputs stay a plain tuple
    (torch.load refuses any other class) and are reachable by name through named()."""
    inputs = (
        "model_tiny.example_inputs()"
        if loader == "load"
        else "(np.zeros((2, 3, 8, 8), np.float32), np.zeros(2, np.float32))"
    )
    code = (
        "import inspect, pydoc, numpy as np, model_tiny\n"
        f"m = model_tiny.{loader}()\n"
        f"out = m(*{inputs})\n"
        "print(type(out).__name__, list(m.named(out)), m.named(out)['logits'] is out[1])\n"
        "print(inspect.signature(m), m.input_names, m.output_names)\n"
        "print(pydoc.render_doc(m, renderer=pydoc.plaintext))\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "tuple ['features', 'logits'] True"
    assert lines[1] == "(x, t, /) ('x', 't') ('features', 'logits')"
    kind = "tensors" if loader == "load" else "arrays"
    assert f"inputs ({kind}, in this order):" in ran.stdout
    for line in (
        "x: float32 ['batch', 3, 8, 8]",
        "t: float32 ['batch']",
        "dims: batch from 1 to 4",
        "returns a tuple, in this order (output_names):",
        "features: float32",
        "logits: float32",
        "__call__(self, x, t, /)",
    ):
        assert line in ran.stdout, line


def test_cpu_load_opens_the_installed_package_without_a_link(installed, wheel):
    m = manifest_of(wheel)
    assert m["relocatable"] is True
    ran = run_in(
        installed, "import model_tiny; print(model_tiny.load().library); print(model_tiny.load_numpy().library)"
    )
    assert ran.returncode == 0, ran.stderr
    package = installed_package(installed) / "artifacts" / "model.so"
    assert ran.stdout.splitlines() == [str(package), str(package)]


def test_link_command_repairs_a_dangling_link(installed, wheel, tmp_path):
    opt_path = Path(manifest_of(wheel)["opt_path"])
    opt_path.parent.mkdir(parents=True, exist_ok=True)
    if opt_path.is_symlink() or opt_path.exists():
        opt_path.unlink()
    opt_path.symlink_to(tmp_path / "gone")
    script = installed.parent / "model-tiny"
    ran = subprocess.run([str(script), "link"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "(repaired)" in ran.stdout and (opt_path / "model.so").is_file()


def test_processes_starting_at_once_all_succeed(installed, wheel):
    code = "import model_tiny; m = model_tiny.load(); print(m(*model_tiny.example_inputs())[1].shape)"
    procs = [
        subprocess.Popen(
            [str(installed), "-W", "default", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for code_, out, err in results:
        assert code_ == 0, err
        assert "torch.Size([2, 4])" in out and "ArtifactLinkWarning" not in err


def test_torch_mismatch_is_refused_naming_both_versions(installed):
    code = "import torch; torch.__version__ = '2.99.0+cpu'\nimport model_tiny\nmodel_tiny.load()"
    ran = run_in(installed, code)
    assert ran.returncode != 0
    assert "IncompatibleRuntime" in ran.stderr
    assert "torch is 2.99.0+cpu, the model was built with torch 2.13.0+cpu" in ran.stderr


def test_bad_call_arguments_are_named(installed):
    code = (
        "import torch, model_tiny\nm = model_tiny.load()\nx, t = model_tiny.example_inputs()\n"
        "for args in [(x,), (x[:, :2], t), (torch.randn(5, 3, 8, 8), torch.rand(5)), (x, t[:1]), (x.double(), t)]:\n"
        "    try:\n        m(*args)\n    except ValueError as e:\n        print(e)\n"
    )
    ran = run_in(installed, code)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "expected 2 tensors (x, t), got 1"
    assert lines[1] == "input 'x': dim 1 must be 3, got 2"
    assert lines[2] == "input 'x': dim 0 (batch) is 5, outside the built range [1, 4]"
    assert lines[3] == "input 't': dim 0 (batch) is 1, but input 'x' has batch=2"
    assert lines[4] == "input 'x': expected dtype float32, got float64"


def test_golden_cases_pass_on_the_installed_wheel(installed):
    ran = subprocess.run([str(installed.parent / "model-tiny"), "verify"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "ok  case golden0: output 'features'" in ran.stdout and "2 golden cases match" in ran.stdout
    # each ok line says which bound passed it: a rel diff over rtol, marked ok, read as a failure
    oks = [line for line in ran.stdout.splitlines() if line.startswith("ok  case ")]
    assert oks and all(re.search(r"\(rtol .*, atol .*\): passed, every .*", line) for line in oks), ran.stdout
    api = run_in(installed, "import model_tiny; print(len(model_tiny.verify()))")
    assert api.returncode == 0 and api.stdout.strip() == "2", api.stderr


def test_altered_golden_output_fails_verify_naming_the_output(installed, tmp_path):
    golden = installed_package(installed) / "golden.safetensors"

    def bump_logits(path, original):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(path))
        tensors["golden1/outputs/logits"] = tensors["golden1/outputs/logits"] + 0.5
        save_file(tensors, str(path))
        # the manifest records the golden file's hash too: re-hash so this tests the numbers, not integrity
        manifest_path = path.parent / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["golden"].update(sha256=hashlib.sha256(path.read_bytes()).hexdigest(), size=path.stat().st_size)
        manifest_path.write_text(json.dumps(manifest))

    manifest_path = golden.parent / "manifest.json"
    with altered(manifest_path, lambda p, o: None), altered(golden, bump_logits):
        ran = subprocess.run([str(installed.parent / "model-tiny"), "verify"], capture_output=True, text=True)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "error: model-tiny 0.1+cpu.torch" in ran.stderr and "differs from its golden outputs" in ran.stderr
    assert "case golden1: output 'logits': max abs diff 0.5" in ran.stderr
    assert "golden0" not in ran.stderr


@pytest.mark.parametrize("damage", ["flip-byte", "truncate"])
def test_altered_so_is_refused_naming_the_file(installed, tmp_path, damage):
    so = installed_package(installed) / "artifacts" / "model.so"

    def change(path, original):
        if damage == "truncate":
            path.write_bytes(original[: len(original) // 2])
        else:
            middle = len(original) // 2
            path.write_bytes(original[:middle] + bytes([original[middle] ^ 0xFF]) + original[middle + 1 :])

    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert run_in(installed, "import model_tiny; model_tiny.load()", **env).returncode == 0
    with altered(so, change):
        ran = run_in(installed, "import model_tiny; model_tiny.load()", **env)
        native = run_in(installed, "import model_tiny; model_tiny.load_numpy()", **env)
        cli = subprocess.run(
            [str(installed.parent / "model-tiny"), "verify"], capture_output=True, text=True, env={**os.environ, **env}
        )
    assert ran.returncode != 0 and "IntegrityError" in ran.stderr
    assert "model_tiny/artifacts/model.so" in ran.stderr or "/cpu/model.so" in ran.stderr
    assert ("the manifest says" in ran.stderr) and ("reinstall the wheel" in ran.stderr)
    assert ("bytes, the manifest says" in ran.stderr) == (damage == "truncate")
    assert cli.returncode == 4 and "error: artifact" in cli.stderr
    assert native.returncode != 0 and "IntegrityError" in native.stderr
    assert run_in(installed, "import model_tiny; model_tiny.load()", **env).returncode == 0, "restored file loads again"


def test_fp64_reference_reports_eager_own_error(variant_build):
    report = json.loads(next(variant_build.glob("*.report.json")).read_text())
    verification = report["verification"]
    assert verification["reference"] == "eager float64" and verification["golden_cases"] == ["golden0"]
    assert [c["case"] for c in verification["cases"]][-1] == "golden0" and "zeros" not in str(verification["cases"])
    for case in verification["cases"]:
        errors = case["eager_vs_fp64_max_abs"]
        assert set(errors) == {"features", "logits"} and all(0 <= e < 1e-3 for e in errors.values())


def test_unchanged_rebuild_reuses_the_verified_wheel(tiny_build, wheel, tmp_path):
    build_dirs, _ = tiny_build

    def build_into(dist: str, *more: str) -> Ran:
        where = ("--root", str(build_dirs.root), "--dist", str(tmp_path / dist), "--build-dir", str(build_dirs.build))
        return run_cli("build", "--spec", str(TINY_SPEC), *where, *more)

    again = build_into("dist")
    assert again.code == 0, again.err
    assert "unchanged since the build in cache build-" in again.err and "reusing its verified wheel" in again.err
    for skipped in ("==> doctor", "==> export", "==> compile", "==> verify", "==> package"):
        assert skipped not in again.err
    assert (tmp_path / "dist" / wheel.name).read_bytes() == wheel.read_bytes()
    report = json.loads((tmp_path / "dist" / "model_tiny-0.1+cpu.torch2.13.0.report.json").read_text())
    assert report["build_cache"]["reused"] is True
    # nothing traced or generated: the cached report named the earlier build's folders (H42)
    assert report["trace_dir"] is None and report["sources_dir"] is None, report
    # into the same dist/: its wheel holds these bytes already, left as it is and said so (H54 read a
    # bare "built" with dist/'s own sha256, where another run said "kept")
    kept_mtime = (tmp_path / "dist" / wheel.name).stat().st_mtime_ns
    same = build_into("dist")
    assert same.code == 0, same.err
    assert f"\nbuilt {wheel.name} (the same bytes as dist/'s wheel: left as it is)\n" in same.err, same.err
    assert (tmp_path / "dist" / wheel.name).stat().st_mtime_ns == kept_mtime
    forced = build_into("dist2", "--no-cache")
    assert forced.code == 0 and "==> export" in forced.err and "==> compile" in forced.err, forced.err
    assert "reused" not in forced.err
    # the export and compile anew give the same wheel, byte for byte (a fresh build folder's rebuild:
    # tests/test_reproduce.py::test_the_session_wheel_is_identical_to_its_rebuild)
    assert (tmp_path / "dist2" / wheel.name).read_bytes() == wheel.read_bytes()


def test_several_specs_build_in_parallel_and_failures_keep_their_code(tiny_build, tmp_path):
    from pipeline import doctor_checks

    from .conftest import BROKEN

    build_dirs, _ = tiny_build
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--spec",
        str(BROKEN / "data_dependent.toml"),
        "-j",
        "2",
        "--root",
        str(build_dirs.root),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(build_dirs.build),
    )
    assert ran.code == doctor_checks.DATA_DEPENDENT.exit_code, ran.err
    assert "1 of 2 builds succeeded" in ran.err and "(2 at a time)" in ran.err
    assert "data_dependent.toml FAILED (exit 24)" in ran.err and "branches on a tensor value" in ran.err
    assert [p.name for p in (tmp_path / "dist").glob("*.whl")] == [
        wheel.name for wheel in build_dirs.dist.glob("*.whl")
    ]
    assert sorted(p.name for p in (build_dirs.build / "logs").iterdir()) == [
        "broken-data_dependent.json",
        "broken-data_dependent.log",
        "tiny-spec.json",
        "tiny-spec.log",
    ]  # log and --json record


def test_platform_tag_is_the_one_auditwheel_gives(wheel, tmp_path):
    """auditwheel's symbol-version policy (glibc and libstdc++), torch's own libraries aside: the
    tiny .so needs GLIBCXX_3.4.30 on this machine, which manylinux_2_34 does not promise."""
    done = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", "--disable-isa-ext-check", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    )
    facts = json.loads(done.stdout)
    assert wheel.name.endswith(f"-py3-none-{facts['sym_tag']}.whl"), (wheel.name, facts["sym_tag"])
    assert set(facts["external_libs"]) <= {"libtorch_cpu.so", "libc10.so", "libgomp.so.1", "libtorch.so"}
    # The package stage's guess, made from the same symbol-version table, is auditwheel's: one wheel build.
    with zipfile.ZipFile(wheel) as archive:
        so = tmp_path / "model.so"
        so.write_bytes(archive.read(next(n for n in archive.namelist() if n.endswith("/model.so"))))
    assert package.platform_tag([so], "x86_64") == facts["sym_tag"]
