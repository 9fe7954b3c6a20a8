"""A build always ends, whatever threads the model leaves running (tokenizer pools, telemetry),
with the build's own exit code; under --json the model's prints go to stderr and stdout holds
exactly one JSON document."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pipeline.errors import BuildInterrupted, ModelLoadError

from .conftest import REPO, TINY_SPEC

# A factory that prints 40,000 lines (from Python and from C) and leaves a non-daemon thread
# waiting forever: the process never exited, and SIGTERM did nothing.
LINGERING = """
import os, threading
import tiny_model

def build(channels: int = 8, fail: bool = False):
    threading.Thread(target=threading.Event().wait, name="telemetry", daemon=False).start()
    for i in range(20000):
        print("factory says", i)
    os.system("seq 20000")
    if fail:
        raise RuntimeError("the factory gave up")
    return tiny_model.build(channels)
"""


def build_lingering(tmp_path, fail: bool, *flags: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "spec"
    shutil.copytree(TINY_SPEC.parent, folder)
    (folder / "lingering.py").write_text(LINGERING)
    spec = folder / "spec.toml"
    spec.write_text(
        spec.read_text()
        .replace('factory = "tiny_model:build"', 'factory = "lingering:build"')
        .replace("kwargs = { channels = 8 }", f"kwargs = {{ channels = 8, fail = {str(fail).lower()} }}")
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            "--spec",
            str(spec),
            "--root",
            str(tmp_path / "o"),
            "--dist",
            str(tmp_path / "d"),
            "--build-dir",
            str(tmp_path / "b"),
            *flags,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def test_a_failed_build_ends_though_the_model_left_a_thread(tmp_path):
    try:
        ran = build_lingering(tmp_path, True)
    except subprocess.TimeoutExpired:
        pytest.fail("the build never exited: a thread the model left kept the process alive")
    assert ran.returncode == ModelLoadError.exit_code, ran.stderr[-2000:]
    assert "the factory gave up" in ran.stderr


def test_a_json_build_ends_with_one_json_document_on_stdout(tmp_path):
    try:
        ran = build_lingering(tmp_path, False, "--json")
    except subprocess.TimeoutExpired:
        pytest.fail("the build never exited: a thread the model left kept the process alive")
    assert ran.returncode == 0, ran.stderr[-2000:]
    record = json.loads(ran.stdout)  # exactly one document: the factory's 40,000 lines went elsewhere
    assert record["exit_code"] == 0 and record["builds"][0]["model"] == "tiny"
    assert "factory says 19999" in ran.stderr and "\n20000\n" in ran.stderr


# A stop that lands while C code runs Python through PyRun_String (torch's compile does) sets
# CPython's "unhandled KeyboardInterrupt" flag for good, though the CLI handles the stop: the
# interpreter's exit then killed the build by SIGINT (exit -2) after it printed its error.
STOPPED_INSIDE_C = """
import ctypes
import tiny_model

def build(channels: int = 8):
    ctypes.pythonapi.PyRun_SimpleString(
        b"import os, signal, time; os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)"
    )
    return tiny_model.build(channels)
"""


def test_a_build_stopped_inside_c_code_exits_with_the_interrupted_code(tmp_path):
    folder = tmp_path / "spec"
    shutil.copytree(TINY_SPEC.parent, folder)
    (folder / "stopped.py").write_text(STOPPED_INSIDE_C)
    spec = folder / "spec.toml"
    spec.write_text(spec.read_text().replace('factory = "tiny_model:build"', 'factory = "stopped:build"'))
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "build",
            "--spec",
            str(spec),
            "--root",
            str(tmp_path / "o"),
            "--dist",
            str(tmp_path / "d"),
            "--build-dir",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert ran.returncode == BuildInterrupted.exit_code, ran.stderr[-2000:]
    assert "error: build stopped by SIGTERM" in ran.stderr
