"""Builds that run at once: several versions of one model, one work folder held by one build."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pipeline.errors import OutputDirError
from pipeline.services.outdir import claim_output_dir

from .conftest import REPO, TINY_SPEC, BuildDirs, run_cli

# Several versions of one model built at once, each its own process, into one --build-dir:
# test_build_stops.py's test_two_versions_built_at_once_both_succeed (the next builds after a
# stopped parallel build of those versions, so their two fresh compiles serve both tests).


def test_a_work_folder_is_held_by_one_build(tmp_path):
    """Two builds of one model, version and target into other roots but one --build-dir."""
    from pipeline.services.layout import WorkLayout, hold_work_dir

    work = WorkLayout(tmp_path / "build").work_dir("tiny", "0.2", "cpu")
    with hold_work_dir(work):
        with pytest.raises(
            OutputDirError,
            match=f"another build \\(pid {os.getpid()}: .*\\) is using the work folder {work}; its lock is ",
        ) as info:
            with hold_work_dir(work):
                pass
        assert "--build-dir" in info.value.hint
    with hold_work_dir(work):  # released: the next build takes it
        pass


def test_a_build_whose_output_folder_is_held_stops_before_the_doctor(dirs):
    """Another build writing the same <root>/<model>/<version>/<target>: refused before the doctor and
    export (the minutes they take would be lost), naming the holder and the way to build elsewhere."""
    with claim_output_dir(dirs.root / "tiny" / "0.1" / "cpu"):  # this test process stands for the other build
        ran = run_cli("build", "--spec", str(TINY_SPEC), *dirs.args())
    assert ran.code == OutputDirError.exit_code, ran.err
    assert f"another build (pid {os.getpid()}: " in ran.err and "--root DIR" in ran.err, ran.err
    assert "==> doctor" not in ran.err and "==> export" not in ran.err, ran.err


def test_a_build_whose_work_folder_is_held_stops_before_the_doctor(dirs):
    """Another build into another --root and --dist but the same --build-dir holds the work folder:
    refused before the doctor too, with the way out, and the holder's folder left as it was."""
    from pipeline.services.layout import WorkLayout, hold_work_dir

    work = WorkLayout(dirs.build).work_dir("tiny", "0.1", "cpu")
    with hold_work_dir(work):  # this test process stands for the other build
        (work / "theirs").write_text("the other build's file")
        ran = run_cli("build", "--spec", str(TINY_SPEC), "--update-lock", *dirs.args())
        assert (work / "theirs").read_text() == "the other build's file"
    assert ran.code == OutputDirError.exit_code, ran.err
    assert (
        f"another build (pid {os.getpid()}: " in ran.err
        and f"is using the work folder {work}; its lock is " in ran.err
        and "--build-dir" in ran.err
    ), ran.err
    assert "==> doctor" not in ran.err and "==> export" not in ran.err, ran.err
    # what the spec's lock means for this build is not said by a build that is refused (a newcomer's
    # read "its choice is added to spec.lock.json" just before the refusal)
    assert "--update-lock:" not in ran.err, ran.err
    assert dirs.leftovers() == []


HELD_IN_DOCTOR = """import os, pathlib, time
import tiny_model

class Held(tiny_model.Tiny):
    def forward(self, x, t):
        folder = os.environ.get("HOLD_IN_FORWARD")
        if folder:  # the first build: stopped in its doctor's first eager call until the test is done
            pathlib.Path(folder, "entered").touch()
            while not pathlib.Path(folder, "go").exists():
                time.sleep(0.1)
        return super().forward(x, t)

def build(channels=8):
    return Held(channels)
"""


def test_a_second_build_started_during_the_firsts_doctor_is_refused_before_its_own(dirs, tmp_path):
    """H23 started two builds of one model seconds apart (other --root and --dist, one --build-dir):
    both passed the check for a held work folder, and the second was refused after its 85 s doctor
    and its export. The work folder is now held from the doctor on."""
    (tmp_path / "held_model.py").write_text(HELD_IN_DOCTOR)
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text().replace('factory = "tiny_model:build"', 'factory = "held_model:build"'))
    path = os.pathsep.join([str(tmp_path), str(TINY_SPEC.parent)])
    first = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "build", "--spec", str(spec), *dirs.args()],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": path, "HOLD_IN_FORWARD": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "entered").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first build never reached its doctor"
            time.sleep(0.1)
        other = BuildDirs(root=tmp_path / "root2", dist=tmp_path / "dist2", build=dirs.build)
        ran = run_cli("build", "--spec", str(spec), *other.args(), env={"PYTHONPATH": path})
    finally:
        (tmp_path / "go").touch()
        first.kill()
        first.wait(timeout=60)
    assert ran.code == OutputDirError.exit_code, ran.err
    assert f"another build (pid {first.pid}: " in ran.err and "is using the work folder" in ran.err, ran.err
    assert "==> doctor" not in ran.err and "==> export" not in ran.err, ran.err
