"""The CPU kind a cpu wheel is built for is chosen, recorded and checked: `--cpu-isa`, the spec's
`[build.cpu] isa` and MODELWHEEL_CPU_ISA; a GPU torch never builds a CPU wheel; a wheel refused
at load says which CPU kind it needs and what to do, not to reinstall a torch that is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

from pipeline.errors import TargetUnavailableError, UsageError

from .conftest import REPO, TINY_SPEC, run_cli


def build_patched(patch: str, *args: str, cwd) -> subprocess.CompletedProcess:
    """The CLI's build in a process whose torch is altered by ``patch`` first (what this machine
    cannot be: a CUDA build of torch, a CPU of another kind)."""
    code = f"import sys, torch; {patch}; from pipeline.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "build", "--spec", str(TINY_SPEC), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_cpu_wheel_is_never_built_with_a_gpu_torch(dirs):
    """Its pin (torch==2.13.0, or +cu130) would install beside a CPU user's torch, whose version
    (+cpu) the runtime then refuses: the build is refused instead, before anything is written."""
    ran = build_patched("torch.version.cuda = '13.0'", *dirs.args(), cwd=REPO)
    assert ran.returncode == TargetUnavailableError.exit_code, ran.stderr
    assert "is a GPU build; a CPU wheel pins the torch it was built with" in ran.stderr
    assert "+cpu --index-url https://download.pytorch.org/whl/cpu" in ran.stderr
    assert dirs.leftovers() == []


def test_a_cpu_kind_this_machine_cannot_run_is_refused(dirs):
    ran = build_patched(
        "torch.backends.cpu.get_cpu_capability = lambda: 'AVX2'", "--cpu-isa", "avx512", *dirs.args(), cwd=REPO
    )
    assert ran.returncode == TargetUnavailableError.exit_code, ran.stderr
    assert "asks for AVX512 kernels" in ran.stderr and "this CPU runs AVX2 at most" in ran.stderr
    assert dirs.leftovers() == []


def test_an_unknown_cpu_kind_in_the_environment_is_a_usage_error(dirs):
    ran = run_cli("build", "--spec", str(TINY_SPEC), *dirs.args(), env={"MODELWHEEL_CPU_ISA": "sse9"})
    assert ran.code == UsageError.exit_code
    assert "MODELWHEEL_CPU_ISA='sse9' is not a CPU kind" in ran.err and "native, avx2, avx512" in ran.err


def test_the_spec_names_a_cpu_kind(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text() + '\n[build.cpu]\nisa = "avx3"\n')
    ran = run_cli(
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "d"),
        "--build-dir",
        str(tmp_path / "b"),
    )
    assert ran.code == 3 and "key 'build.cpu.isa'" in ran.err and "'native', 'avx2' or 'avx512'" in ran.err


def refusals(installed, capability: str) -> list[str]:
    """The last line of load()'s and load_numpy()'s refusal where torch is told to run ``capability``."""
    messages = []
    for loader in ("load", "load_numpy"):
        ran = subprocess.run(
            [str(installed), "-c", f"import model_tiny; model_tiny.{loader}()"],
            capture_output=True,
            text=True,
            cwd="/",
            env={**os.environ, "ATEN_CPU_CAPABILITY": capability},
        )
        assert ran.returncode != 0, loader
        messages.append(ran.stderr.strip().splitlines()[-1])
    return messages


def test_a_wheel_refused_for_its_cpu_kind_says_so(installed, wheel):
    """The session's wheel is built for this machine's own kind; with ATEN_CPU_CAPABILITY=avx2 the
    torch that is installed runs AVX2 kernels, and the refusal says that, not to install torch."""
    with zipfile.ZipFile(wheel) as archive:
        needs = json.loads(archive.read("model_tiny/manifest.json"))["platform"]["cpu_capability"]
    if needs != "AVX512":
        pytest.skip(f"the wheel is built for {needs} (this CPU has no AVX-512): nothing runs below it here")
    for message in refusals(installed, "avx2"):
        assert "torch runs AVX2 kernels here, as ATEN_CPU_CAPABILITY=avx2 asks" in message
        assert "built for AVX512 CPUs" in message and "--cpu-isa avx2" in message
        assert "pip install torch" not in message


def test_a_refusal_below_avx2_names_a_build_that_exists(installed):
    """ATEN_CPU_CAPABILITY=default (or a CPU without AVX2) runs below every kind `--cpu-isa`
    names: the refusal must not send the user to a `--cpu-isa default` that does not exist."""
    from pipeline.targets.cpu import ISA_CHOICES

    for message in refusals(installed, "default"):
        assert "torch runs DEFAULT kernels here, as ATEN_CPU_CAPABILITY=default asks" in message
        assert "unset ATEN_CPU_CAPABILITY" in message and "--cpu-isa native" in message
        assert "--cpu-isa default" not in message and "pip install torch" not in message
    # the runtime's list of named kinds is the build's
    ran = subprocess.run(
        [str(installed), "-c", "import model_tiny._target_cpu as m; print(*m.NAMED_CPU_KINDS)"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert ran.stdout.split() == [kind.upper() for kind in ISA_CHOICES if kind != "native"], ran.stderr


def test_the_summary_and_info_say_which_machines_a_wheel_runs_on():
    """A newcomer's default build ran on AVX-512 CPUs only, and only `info`'s cpu_capability said so:
    they would have published it for AVX2 hosts. Each target says it in words, the build's summary
    (through the build's target) and `info` (through the wheel's runtime module) alike."""
    from pipeline import targets
    from pipeline.wheel_template.runtime import _target_cuda

    def cpu_wheel(**platform: str) -> dict:
        return {"target": "cpu", "platform": {"machine": "x86_64", **platform}}

    runs_on = targets.get("cpu").where_it_runs
    assert runs_on(cpu_wheel(cpu_capability="AVX512")) == (
        "x86-64 CPUs with AVX512, the build machine's kind (native; --cpu-isa avx2 builds one for any x86-64 CPU "
        "with AVX2)"
    )
    assert runs_on(cpu_wheel(cpu_capability="AVX2")) == "x86-64 CPUs with AVX2, the build machine's kind (native)"
    assert runs_on(cpu_wheel(cpu_capability="AVX2", onednn_max_isa="AVX2")) == (
        "x86-64 CPUs with AVX2 (built for that kind by name: --cpu-isa avx2)"
    )
    assert runs_on({"target": "cpu", "platform": {"machine": "aarch64"}}) == "aarch64 CPUs like the build machine's"
    # the summary's installs: a --cpu-isa build's file name is the native build's, and an index keeps one (H60)
    from pathlib import Path

    from pipeline.summary import usage_lines

    names = {"import_name": "model_tiny", "dist_name": "model-tiny", "variant": "cpu", "version": "0.1"}
    named = {**names, **cpu_wheel(cpu_capability="AVX2", onednn_max_isa="AVX2"), "relocatable": True}
    note = (
        "            (an index keeps one wheel of a version, and a native build's has this file name: publish this "
        "one to an index without it, or bump the version)"
    )
    assert note in usage_lines(Path("/d/w.whl"), named)
    assert note not in usage_lines(Path("/d/w.whl"), {**names, **cpu_wheel(cpu_capability="AVX2"), "relocatable": True})
    needs = _target_cuda.requirements("13.0", (9, 0))
    assert targets.get("cuda").where_it_runs({"cuda": {**needs, "multi_arch": False}}) == (
        "NVIDIA GPUs of compute capability 9.0 (sm_90) only (the build GPU's), with a driver for CUDA 13.0 "
        f"({needs['min_driver']} or newer)"
    )
    assert "(sm_90) and newer (its PTX)" in _target_cuda.where_it_runs({"cuda": {**needs, "multi_arch": True}})
