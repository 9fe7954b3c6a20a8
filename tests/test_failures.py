"""Each way a build can fail: its own message, hint and exit code, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.errors import BuildInterrupted, ExportError, OutputDirError, ToolchainError, VerificationError

from .conftest import BROKEN, REPO, TINY_SPEC, run_cli


def build(spec, dirs, env=None):
    return run_cli("build", "--spec", str(spec), *dirs.args(), env=env)


def test_data_dependent_branch_names_the_line(dirs):
    ran = build(BROKEN / "data_dependent.toml", dirs)
    assert ran.code == ExportError.exit_code, ran.err
    source = (BROKEN / "broken_models.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "if x.sum() > 0" in text)
    assert f"broken_models.py:{line}: if x.sum() > 0:" in ran.err
    assert "hint: the code branches on tensor values" in ran.err and "torch.cond" in ran.err
    assert dirs.leftovers() == []


@pytest.mark.parametrize(
    ("spec", "says"),
    [("optional_argument.toml", "parameter 'scale' is optional"), ("variadic.toml", "forward takes *xs")],
)
def test_forward_signature_problems(dirs, spec, says):
    ran = build(BROKEN / spec, dirs)
    assert ran.code == ExportError.exit_code, ran.err
    assert "broken_models.py:" in ran.err and says in ran.err and "hint: " in ran.err
    assert dirs.leftovers() == []


def test_numerics_failure_reports_diffs_and_leaves_nothing(dirs):
    ran = build(BROKEN / "random_forward.toml", dirs)
    assert ran.code == VerificationError.exit_code, ran.err
    assert "error: compiled model differs from eager" in ran.err
    assert "output 'y': max abs diff" in ran.err and "case seed0" in ran.err
    assert "hint: " in ran.err and "rtol/atol" in ran.err
    assert dirs.leftovers() == []


def test_missing_compiler(dirs):
    ran = build(TINY_SPEC, dirs, env={"CXX": "/nonexistent/g++"})
    assert ran.code == ToolchainError.exit_code, ran.err
    assert "C++ compiler check (/nonexistent/g++)" in ran.err
    assert "hint: AOTInductor needs a C++ compiler" in ran.err
    assert dirs.leftovers() == []


def test_output_folder_not_made_by_a_build_is_left_alone(dirs):
    foreign = dirs.root / "tiny" / "0.1" / "cpu"
    foreign.mkdir(parents=True)
    (foreign / "keep.txt").write_text("user data")
    ran = build(TINY_SPEC, dirs)
    assert ran.code == OutputDirError.exit_code, ran.err
    assert f"{foreign} exists and was not made by a build" in ran.err
    assert (foreign / "keep.txt").read_text() == "user data"
    assert not dirs.dist.exists()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_interrupted_build_removes_everything(dirs, how):
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "build", "--spec", str(TINY_SPEC), *dirs.args()],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("==> compile"):
            break
    time.sleep(1.0)  # inside AOTInductor now
    assert (dirs.root / "tiny" / "0.1" / "cpu").is_dir(), "".join(seen)
    if how == "SIGINT":  # Ctrl-C reaches the whole process group, the C++ compiler too
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    err = "".join(seen) + proc.stderr.read()
    assert proc.wait(timeout=120) == BuildInterrupted.exit_code, err
    assert f"error: build stopped by {how}" in err
    assert dirs.leftovers() == []
