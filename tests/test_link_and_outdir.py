"""The /opt link (runtime side) and the build's claim on the output folder (pipeline side)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from pipeline.errors import OutputDirError
from pipeline.services.outdir import MARKER, claim_output_dir, refuse_if_held
from pipeline.wheel_template.runtime import _link as link_module


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    folder = tmp_path / "site-packages" / "model_x" / "artifacts"
    folder.mkdir(parents=True)
    (folder / "model.so").write_bytes(b"\x7fELF")
    return folder


def test_link_is_created_then_left_in_place(tmp_path, artifacts):
    link = tmp_path / "opt" / "x" / "1.0" / "cpu"
    ok, detail = link_module.ensure_link(link, artifacts)
    assert ok and detail.endswith("(created)")
    assert (link / "model.so").read_bytes() == b"\x7fELF"
    ok, detail = link_module.ensure_link(link, artifacts)
    assert ok and detail.endswith("(already in place)")


@pytest.mark.parametrize("old_target", ["gone", "other"])
def test_dangling_or_foreign_link_is_repaired(tmp_path, artifacts, old_target):
    (tmp_path / "other").mkdir()
    link = tmp_path / "opt" / "cpu"
    link.parent.mkdir()
    link.symlink_to(tmp_path / old_target)
    ok, detail = link_module.ensure_link(link, artifacts)
    assert ok and detail.endswith("(repaired)")
    assert link.resolve() == artifacts.resolve()


def test_real_folder_in_the_way_is_not_touched(tmp_path, artifacts):
    link = tmp_path / "opt" / "cpu"
    link.mkdir(parents=True)
    (link / "data").write_text("x")
    ok, detail = link_module.ensure_link(link, artifacts)
    assert not ok and "is not a symlink" in detail
    assert (link / "data").read_text() == "x"


def test_unwritable_parent_reports_instead_of_raising(tmp_path, artifacts):
    blocker = tmp_path / "opt"
    blocker.write_text("a file, not a folder")
    ok, detail = link_module.ensure_link(blocker / "x" / "cpu", artifacts)
    assert not ok and detail.startswith(f"cannot write {blocker / 'x' / 'cpu'}")


def test_concurrent_linkers_all_succeed(tmp_path, artifacts):
    link = tmp_path / "opt" / "x" / "cpu"
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(link_module.ensure_link(link, artifacts))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and all(ok for ok, _ in results)
    assert link.resolve() == artifacts.resolve()
    assert not [p for p in link.parent.iterdir() if ".tmp-" in p.name]


def test_claim_creates_and_removes_folder_and_new_parents(tmp_path):
    out = tmp_path / "root" / "m" / "1.0" / "cpu"
    with claim_output_dir(out) as claimed:
        assert claimed == out and (out / MARKER).exists()
        (out / "model.so").write_bytes(b"x")
    assert not (tmp_path / "root").exists()


def test_claim_cleans_up_after_an_error_and_restores_a_link(tmp_path, artifacts):
    out = tmp_path / "root" / "cpu"
    out.parent.mkdir(parents=True)
    out.symlink_to(artifacts)
    with pytest.raises(RuntimeError):
        with claim_output_dir(out):
            assert not out.is_symlink() and out.is_dir()
            raise RuntimeError("compile failed")
    assert out.is_symlink() and out.resolve() == artifacts.resolve()
    assert sorted(p.name for p in out.parent.iterdir()) == ["cpu"]


def test_claim_replaces_a_killed_builds_leftover(tmp_path):
    out = tmp_path / "root" / "cpu"
    out.mkdir(parents=True)
    (out / MARKER).write_text("")
    (out / "half.so").write_bytes(b"x")
    with claim_output_dir(out):
        assert not (out / "half.so").exists()
    assert not out.exists()


def test_claim_refuses_a_folder_it_did_not_make(tmp_path):
    out = tmp_path / "root" / "cpu"
    out.mkdir(parents=True)
    with pytest.raises(OutputDirError, match="exists and was not made by a build"):
        with claim_output_dir(out):
            pass
    assert out.is_dir()


def test_claim_refuses_while_another_build_holds_it(tmp_path):
    out = tmp_path / "root" / "cpu"
    with claim_output_dir(out):
        with pytest.raises(OutputDirError, match="another build .* is writing") as info:
            with claim_output_dir(out):
                pass
        assert out.is_dir(), "the refused claim must not remove the holder's folder"
        assert (out.parent / ".cpu.build.lock").exists(), "nor the holder's lock file"
    # The holder is named (its pid and command, read from the lock file and /proc) and so are the ways out.
    assert f"pid {os.getpid()}: " in info.value.message and "pytest" in info.value.message
    assert "--root DIR" in info.value.hint and "MODELWHEEL_ROOT" in info.value.hint and "wait" in info.value.hint


def test_peek_refuses_while_held_and_takes_nothing(tmp_path):
    """The peek before the doctor refuses exactly as the claim would, and leaves the lock free after."""
    out = tmp_path / "root" / "cpu"
    refuse_if_held(out)  # nothing there: no refusal, nothing made
    assert not out.parent.exists()
    with claim_output_dir(out):
        with pytest.raises(OutputDirError, match=f"another build \\(pid {os.getpid()}: .*\\) is writing {out}"):
            refuse_if_held(out)
    refuse_if_held(out)  # released: no refusal
    with claim_output_dir(out):  # and the peek left no lock behind
        pass


HOLDER = """import pathlib, sys
from pipeline.services.outdir import claim_output_dir
with claim_output_dir(pathlib.Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_the_holders_command_is_named_on_one_line(tmp_path):
    """Another process holds the folder: its pid and command line (here one with newlines, as any
    process's may have) are named on one line, with no control characters."""
    out = tmp_path / "root" / "cpu"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(OutputDirError) as info:
            refuse_if_held(out)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    message = info.value.message
    assert f"another build (pid {holder.pid}: {sys.executable} -c import pathlib, sys from pipeline" in message
    assert message.isprintable(), message


NOBODY = 65534
START = (
    "import numpy as np, model_tiny\n"
    "m = model_tiny.load()\n"
    "m(*model_tiny.example_inputs())\n"
    "n = model_tiny.load_numpy()\n"
    "n(np.zeros((2, 3, 8, 8), np.float32), np.zeros(2, np.float32))\n"
)


def _tree(root: Path) -> list[str] | None:
    return sorted(str(p) for p in root.rglob("*")) if root.exists() else None


def _let_others_through(path: Path) -> list[tuple[Path, int]]:
    """o+x on ``path``'s folders that lack it (pytest's are 0700), so another user can reach it;
    returns the modes to put back."""
    changed = []
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)
            changed.append((folder, mode))
    return changed


def _as_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_cpu_wheel_starts_writing_nothing_and_printing_nothing(installed, wheel, tmp_path, user):
    """A CPU .so loads from site-packages as it is: load() and load_numpy() in a fresh process make
    no /opt link and no lock file (even where they could: as root), and warn about nothing (even
    where they could not: as a non-root user whose HOME it may not read). Warnings are errors here."""
    if os.geteuid() != 0:
        pytest.skip("runs the loader as root and as uid 65534: the tests must run as root for that")
    with zipfile.ZipFile(wheel) as archive:
        opt_path = Path(json.loads(archive.read("model_tiny/manifest.json"))["opt_path"])
    root = opt_path.parents[2]  # the artifact root the build compiled under
    if opt_path.is_symlink():  # made by another test's `model-tiny link`
        opt_path.unlink()
    before = _tree(root)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)  # root's: uid 65534 can neither read nor write it
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"} | {"HOME": str(home)}
    restore = _let_others_through(installed.parent) + _let_others_through(tmp_path) if user == "nobody" else []
    try:
        ran = subprocess.run(
            [str(installed), "-W", "error", "-c", START],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            preexec_fn=_as_nobody if user == "nobody" else None,
            timeout=300,
        )
    finally:
        for folder, mode in reversed(restore):
            folder.chmod(mode)
    assert ran.returncode == 0, ran.stderr
    assert (ran.stdout, ran.stderr) == ("", "")
    assert _tree(root) == before, "nothing is written under the artifact root"
