"""Each way a build can fail: its own message, hint and exit code, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline.errors import BuildInterrupted, OutputDirError, ToolchainError

from .conftest import REPO, TINY_SPEC, run_cli


def build(spec, dirs, env=None):
    return run_cli("build", "--spec", str(spec), *dirs.args(), env=env)


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


def test_interrupt_redelivered_after_the_outcome_does_not_kill_the_process():
    """CI once saw a stopped build print its error and then die by SIGINT (exit -2, not 130): the
    unraisable hook's timer re-delivered the interrupt after main() had decided. A late interrupt
    is recorded, never raised."""
    script = textwrap.dedent("""
        import _thread, signal, sys, time
        from pipeline import cli
        from pipeline.progress import stop_requested

        def stopped(args, progress):
            stop_requested.append("SIGINT")
            raise KeyboardInterrupt

        cli.COMMANDS["matrix"] = stopped
        code = cli.main(["matrix"])
        _thread.interrupt_main(signal.SIGINT)  # what the hook's timer does, once main() has returned
        time.sleep(0.2)
        sys.exit(code)
    """)
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ran.returncode == BuildInterrupted.exit_code, ran.stderr
    assert "error: matrix stopped by SIGINT" in ran.stderr
