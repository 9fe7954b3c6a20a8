"""Two builds of one model version for two torch versions on one index: pip gets the one for its torch.

The pipeline and the wheel runtime must work with any torch from 2.11 to 2.14: the other torch is
the newest (2.14.1) and the oldest (2.11.0), each the CPU build from PyTorch's CPU index, as the
build asks (a CPU wheel built with a GPU torch would pin that torch: exit 17 refuses it). Where
that index cannot be reached (only PyPI's CUDA builds can), the test skips saying so. Slow
(installs each, several GB): `make test-slow` runs it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from .conftest import REPO, TINY_SPEC, make_venv, pip_install, run_cli

pytestmark = pytest.mark.slow
OTHER_TORCHES = ["2.14.1", "2.11.0"]
PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"
DIST_VERSION = "import importlib.metadata as m; print(m.version('torch'))"


def run(python: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module", params=OTHER_TORCHES)
def other_torch_env(request, tmp_path_factory) -> tuple[str, Path]:
    python = make_venv(tmp_path_factory.mktemp("torch-other") / "env", sees_torch=False)  # another torch
    cpu_torch = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--retries",
            "0",
            "--timeout",
            "20",
            f"torch=={request.param}+cpu",
            "--index-url",
            PYTORCH_CPU,
        ],
        capture_output=True,
        text=True,
    )
    if cpu_torch.returncode != 0:
        said = [line for line in cpu_torch.stderr.splitlines() if line.startswith("ERROR:")] or ["refused"]
        pytest.skip(f"torch {request.param}'s CPU build cannot be had here from {PYTORCH_CPU}: {said[0]}")
    # The pipeline's ranges (pyproject.toml), not requirements.txt's pins: torch 2.11 needs setuptools<82.
    pip_install(python, f"torch=={request.param}+cpu", "-e", f"{REPO}[test]")
    return request.param, python


def test_pip_picks_the_wheel_built_for_its_torch(tmp_path, tiny_build, other_torch_env):
    other_torch, other_python = other_torch_env
    first = next(tiny_build[0].dist.glob("*.whl"))
    build = run(
        other_python,
        "-m",
        "pipeline",
        "build",
        "--spec",
        str(TINY_SPEC),
        "--root",
        str(tiny_build[0].root),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
    )
    assert build.returncode == 0, build.stderr
    second = next((tmp_path / "dist").glob("*.whl"))
    assert f"+cpu.torch{other_torch}-" in second.name and first.name != second.name

    home = tmp_path / "index"
    home.mkdir()
    assert run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home).code == 0
    try:
        url = json.loads((home / "build" / "index" / "state.json").read_text())["url"] + "cpu/simple"
        published = run_cli("publish", "--wheel", str(first), str(second), cwd=home)
        assert published.code == 0 and "published 2 wheel(s)" in published.err, published.err

        this = make_venv(tmp_path / "this-torch")
        pip_install(this, f"torch=={torch.__version__}")
        for python, wheel in ((this, first), (other_python, second)):
            # pip may prefer the highest label and swap torch; pinning the installed torch in the
            # same command keeps it and selects the matching build (docs/publishing.md).
            installed = run(python, "-c", DIST_VERSION).stdout.strip()
            pip_install(python, "model-tiny==0.1", f"torch=={installed}", "--index-url", url)
            ran = run(
                python,
                "-c",
                DIST_VERSION + "; import model_tiny; model_tiny.load(); print(model_tiny.__version__)",
                cwd=Path("/"),
            )
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.split() == [installed, wheel.name.split("-")[1]]
    finally:
        run_cli("index", "stop", cwd=home)
