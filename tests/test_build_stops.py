"""How a build stops: a missing compiler, an output folder it did not make, and SIGINT/SIGTERM
at any point (a parallel build's children, early in compile, inside C code): its own message,
hint and exit code, nothing left under the root, in dist/ or in the cache, and nothing that
blocks the next build. The next builds after a stopped parallel build are two versions of one model
built at once, each its own process (test_two_versions_built_at_once_both_succeed)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.errors import BuildInterrupted, OutputDirError, ToolchainError
from pipeline.services import progress

from .conftest import GOOD, REPO, TINY_SPEC, BuildDirs, Ran, run_cli, spec_copy, start_cli, wheel_manifest


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
def test_interrupted_build_removes_everything(tmp_path, how):
    """Stopped inside AOTInductor: nothing under the root, in dist/ or in the cache, and the message
    says what it kept. SIGINT is a terminal's Ctrl-C: it reaches the whole process group, the C++
    compiler too."""
    folders = BuildDirs(root=tmp_path / "opt", dist=tmp_path / "dist", build=tmp_path / "build")
    proc = start_cli("build", "--spec", str(TINY_SPEC), *folders.args())  # stopped_cleanly reads these folders
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("==> compile"):
            break
    time.sleep(1.0)  # inside AOTInductor now
    assert (tmp_path / "opt" / "tiny" / "0.1" / "cpu").is_dir(), "".join(seen)
    if how == "SIGINT":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    err = "".join(seen) + proc.stderr.read()
    stopped_cleanly(Ran(proc.wait(timeout=120), "", err), tmp_path, how)


def test_interrupt_redelivered_after_the_outcome_does_not_kill_the_process():
    """CI once saw a stopped build print its error and then die by SIGINT (exit -2, not 130): the
    unraisable hook's timer re-delivered the interrupt after main() had decided. A late interrupt
    is recorded, never raised."""
    script = textwrap.dedent("""
        import _thread, signal, sys, time
        from pipeline import cli
        from pipeline.services.progress import stop_requested

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


def test_an_interrupt_inside_a_torch_dispatch_mode_waits_until_it_returns():
    """A parallel build stopped by Ctrl-C while it traced ended in "terminate called after throwing an
    instance of 'c10::Error' … trying to set the current FakeTensorMode, but one already exists"
    (SIGABRT), not with its exit code: the KeyboardInterrupt was raised inside a dispatch mode's
    Python code, called from torch's C++. It is raised a moment later, outside it."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from pipeline import cli

        class Interrupted(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, at the next bytecode
                for _ in range(1000):
                    pass
                return func(*args, **(kwargs or {}))

        signal.signal(signal.SIGINT, cli._raise_interrupted)
        try:
            with Interrupted():
                out = torch.ones(3) + 1
            time.sleep(5)
        except KeyboardInterrupt as exc:
            # where it was raised: anywhere after the op (a loaded machine's print took it), never in it
            frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
            print("inside the dispatch mode" if "__torch_dispatch__" in frames else "outside it", flush=True)
            sys.exit(0)
        sys.exit(3)
    """).replace("import os, signal, sys, time", "import os, signal, sys, time, traceback")
    ran = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.splitlines() == ["outside it"], ran.stdout


# -- Ctrl-C to a parallel build ----------------------------------------------------------


@dataclass(frozen=True)
class StoppedThenRebuilt:
    dirs: BuildDirs
    versions: tuple[str, ...]
    stopped: Ran  # the parallel build, after its Ctrl-C
    logs: dict[str, str]  # version: its build's log
    left: list[Path]  # what was under the root after the stop
    rebuilt: dict[str, Ran]  # version: the next build of it, the two run at once


@pytest.fixture(scope="module")
def stopped_then_rebuilt(tmp_path_factory) -> StoppedThenRebuilt:
    """Ctrl-C to a parallel build of tiny 0.2 and 0.3 inside their compiles, then the next builds
    of those versions, two fresh builds (the stopped ones stored nothing in the cache) of one
    model started at once into the one --build-dir, all under umask 000: the three tests below
    assert on what they did, so the two versions are compiled twice, not five times."""
    base = tmp_path_factory.mktemp("stopped-then-rebuilt")
    dirs = BuildDirs(root=base / "opt" / "models", dist=base / "dist", build=base / "build")
    versions = ("0.2", "0.3")
    specs = [spec_copy(base / v, GOOD.replace('version = "0.1"', f'version = "{v}"')) for v in versions]
    args = ["build", *(a for s in specs for a in ("--spec", str(s))), "-j", "2", *dirs.args()]
    umask = os.umask(0)  # every build here runs under umask 000, as its children do
    try:
        parent = start_cli(*args)
    finally:
        os.umask(umask)
    seen = []
    for line in parent.stderr:
        seen.append(line)
        if sum(line.startswith("==> build ") for line in seen) == 2:
            break
    logs = [dirs.build / "logs" / f"{v}-spec.log" for v in versions]
    deadline = time.monotonic() + 300
    while not all(log.is_file() and "==> compile" in log.read_text() for log in logs):
        if parent.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(parent.pid, signal.SIGKILL)  # the parent and its builds
            pytest.fail("".join(seen) + parent.stderr.read())
        time.sleep(0.2)
    time.sleep(1.0)  # inside AOTInductor now
    os.killpg(parent.pid, signal.SIGINT)
    err = "".join(seen) + parent.stderr.read()
    stopped = Ran(parent.wait(timeout=120), "", err)
    left = sorted(dirs.root.rglob("*"))
    # The next builds: `--version` on the one spec, each its own process, both at once.
    umask = os.umask(0)
    try:
        builds = [start_cli("build", "--spec", str(TINY_SPEC), "--version", v, *dirs.args()) for v in versions]
    finally:
        os.umask(umask)
    rebuilt = {v: Ran(child.wait(timeout=600), "", child.stderr.read()) for v, child in zip(versions, builds)}
    said = {v: log.read_text() for v, log in zip(versions, logs)}
    return StoppedThenRebuilt(dirs, versions, stopped, said, left, rebuilt)


def test_ctrl_c_to_a_parallel_build_leaves_nothing_that_blocks_the_next(stopped_then_rebuilt):
    """SIGINT to the process group (a terminal's Ctrl-C) reached each build twice, once from the
    terminal and once forwarded by the parent; the second cut the cleanup short, leaving an
    unmarked output folder and its lock, and every later build of the model stopped with exit 10."""
    done = stopped_then_rebuilt
    assert done.stopped.code == BuildInterrupted.exit_code, done.stopped.err
    for log in done.logs.values():
        assert "error: build stopped by SIGINT" in log, log
    assert [p for p in done.left if not p.is_dir()] == [], "no output folder, marker or lock is left"
    assert not [p for p in done.left if p.name.startswith(".")]
    for version, again in done.rebuilt.items():  # the next build of each version is not blocked
        assert again.code == 0, f"--version {version}:\n{again.err}" + "".join(done.logs.values())
    assert len(list(done.dirs.dist.glob("*.whl"))) == 2


def test_two_versions_built_at_once_both_succeed(stopped_then_rebuilt):
    """They shared build/<model>/<target>/ (wheel-src, candidates, sources, the trace): one removed
    the other's files, and a build failed with exit 9 and "report this as a bug". The two builds
    are stopped_then_rebuilt's next builds of 0.2 and 0.3: two processes at once, with an empty cache."""
    dirs = stopped_then_rebuilt.dirs
    for version, again in stopped_then_rebuilt.rebuilt.items():
        assert again.code == 0, f"--version {version}:\n{again.err}"
    sources = set()
    for version in stopped_then_rebuilt.versions:
        [wheel] = sorted(dirs.dist.glob(f"model_tiny-{version}+cpu.*.whl"))
        assert wheel_manifest(wheel)["opt_path"] == str(dirs.root / "tiny" / version / "cpu")
        report = json.loads(next(dirs.dist.glob(f"model_tiny-{version}+cpu.*.report.json")).read_text())
        sources.add(report["sources_dir"])
        assert report["sources_dir"].startswith(str(dirs.build / "tiny" / version / "cpu")), report["sources_dir"]
        assert report["trace_dir"] == str(dirs.build / "tiny" / version / "trace")
    assert len(sources) == 2
    assert [p for p in dirs.root.rglob("*") if not p.is_dir()] == [], "no folder or lock is left under the root"
    # compiled fresh in two version folders (each report names its sources), the same bytes: the .so holds
    # no path of its compile folder, so a new version's build that takes it from the build cache makes
    # its own fresh compile's wheel (H48: `reproduce` of such a wheel said the .so differed)
    libraries = []
    for version in stopped_then_rebuilt.versions:
        [wheel] = sorted(dirs.dist.glob(f"model_tiny-{version}+cpu.*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            libraries.append(archive.read("model_tiny/artifacts/model.so"))
    assert libraries[0] == libraries[1], "the .so differs with the folder it was compiled in"


def test_what_the_build_writes_has_explicit_modes_under_umask_000(stopped_then_rebuilt):
    """What stopped_then_rebuilt's builds wrote under umask 000: dist/ and its wheels and reports,
    and all of the build folder (the cache, the logs, the work files a stop keeps)."""
    dirs = stopped_then_rebuilt.dirs
    assert oct(dirs.dist.stat().st_mode & 0o777) == oct(0o755)
    for made in dirs.dist.iterdir():
        assert oct(made.stat().st_mode & 0o777) == oct(0o644), made
    # the build folder too: its cache is loaded by the next build (under umask 000 it was 0777)
    writable = [
        f"{oct(p.stat().st_mode & 0o777)} {p}"
        for p in [dirs.build, *dirs.build.rglob("*")]
        if not p.is_symlink() and p.stat().st_mode & 0o022
    ]
    assert writable == []


def test_a_second_signal_during_cleanup_does_not_cut_it_short(tmp_path, monkeypatch):
    """The forwarded SIGINT landing while the output folder is removed: cleanup still ends."""
    from pipeline.services import outdir

    real_rmtree = outdir.shutil.rmtree

    def interrupted_rmtree(*args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # Python's default handler: KeyboardInterrupt
        return real_rmtree(*args, **kwargs)

    monkeypatch.setattr(outdir.shutil, "rmtree", interrupted_rmtree)
    out = tmp_path / "root" / "tiny" / "0.1" / "cpu"
    with pytest.raises(KeyboardInterrupt):
        with progress.reporting(progress.QuietProgress(result_stream=None)), outdir.claim_output_dir(out):
            (out / "model.so").write_bytes(b"half")
            raise KeyboardInterrupt  # the first Ctrl-C
    assert not (tmp_path / "root").exists(), sorted(map(str, (tmp_path / "root").rglob("*")))


def test_a_killed_builds_leftovers_and_stale_lock_are_taken_over(tmp_path):
    from pipeline.services.outdir import MARKER, claim_output_dir

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no longer running
    out = tmp_path / "root" / "tiny" / "0.1" / "cpu"
    installed = tmp_path / "site-packages" / "artifacts"
    installed.mkdir(parents=True)
    out.mkdir(parents=True)
    (out / MARKER).write_text(f"made by pid {gone.pid}\n")
    (out / "half.so").write_bytes(b"x")
    (out.parent / ".cpu.build.lock").write_text(f"{gone.pid}\n")
    (out.parent / f".cpu.removing-{gone.pid}").mkdir()
    (out.parent / f".cpu.displaced-{gone.pid}").symlink_to(installed)  # the wheel's link, moved aside
    said = []

    class Recorded(progress.Progress):
        def say(self, text: str) -> None:
            said.append(text)

    with progress.reporting(Recorded()), claim_output_dir(out):
        assert sorted(p.name for p in out.iterdir()) == [MARKER]
    assert said == [
        f"    taking over {out}: a build (pid {gone.pid}) that is no longer running left it locked; removing what it "
        f"left (.cpu.removing-{gone.pid}, the folder itself, .cpu.displaced-{gone.pid})"
    ]
    assert sorted(p.name for p in out.parent.iterdir()) == ["cpu"]
    assert out.is_symlink() and out.resolve() == installed.resolve(), "the installed wheel's link is put back"


def test_a_taken_over_folder_leaves_no_empty_model_and_version_folders(tmp_path):
    """H46: after a killed build was taken over, an empty <model>/<version>/ stayed under the root,
    where a build's own folders are removed as it ends."""
    from pipeline.services.outdir import MARKER, claim_output_dir

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no longer running
    out = tmp_path / "root" / "tiny" / "0.1" / "cpu"
    out.mkdir(parents=True)
    (out / MARKER).write_text(f"made by pid {gone.pid}\n")
    (out.parent / ".cpu.build.lock").write_text(f"{gone.pid}\n")
    with progress.reporting(progress.QuietProgress(result_stream=None)), claim_output_dir(out):
        pass
    assert list((tmp_path / "root").iterdir()) == [], sorted(map(str, (tmp_path / "root").rglob("*")))


# -- an interrupt early in compile stops it, stores nothing, and says what it left -------

SWALLOWING_MODEL = '''"""The tiny model, plus a garbage-collector callback that sends this process SIGINT once, early
in compile: the handler's KeyboardInterrupt is raised inside the callback, where Python drops it,
as it does in torch's own finalizers and weakref callbacks."""

import gc
import os
import signal
import sys

from tiny_model import build  # noqa: F401

sent = []


def _interrupt_inside_gc(phase, info):
    if sent or phase != "start" or "torch._inductor.compile_fx" not in sys.modules:
        return
    sent.append(True)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs here, inside the callback
        pass


gc.callbacks.append(_interrupt_inside_gc)
'''


def stopped_cleanly(ran: Ran, tmp_path: Path, how: str = "SIGINT") -> Path:
    """The stop's message names exactly what it kept; returns the work files' folder."""
    work = tmp_path / "build" / "tiny" / "0.1"
    assert ran.code == BuildInterrupted.exit_code, ran.err
    assert (
        f"error: build stopped by {how}: nothing of it is left under {tmp_path / 'opt'} or in {tmp_path / 'dist'}, "
        f"and nothing was stored in the build cache; its work files in {work}/ (trace, generated sources so far, "
        "the work folder's lock) are kept for inspection; the next build of tiny 0.1 replaces them" in ran.err
    ), ran.err
    assert "Traceback" not in ran.err
    assert work.is_dir(), "the message names what is there"
    assert not (tmp_path / "opt").exists() and not (tmp_path / "dist").exists()
    assert not (tmp_path / "build" / "cache").exists() or not list((tmp_path / "build" / "cache").iterdir())
    return work


def test_an_interrupt_python_drops_in_a_gc_callback_still_stops_the_compile(tmp_path):
    """Ctrl-C early in compile went on for about 10 s and stored the compiled model in the cache:
    the KeyboardInterrupt had landed in a callback inside torch, where Python drops it."""
    spec = spec_copy(tmp_path / "spec", GOOD.replace("tiny_model:build", "swallowing_model:build"))
    (spec.parent / "swallowing_model.py").write_text(SWALLOWING_MODEL)
    folders = BuildDirs(root=tmp_path / "opt", dist=tmp_path / "dist", build=tmp_path / "build")
    ran = run_cli("build", "--spec", str(spec), *folders.args())
    work = stopped_cleanly(ran, tmp_path)
    assert "==> compile" in ran.err and "compile done" not in ran.err
    candidate = work / "cpu" / "candidates" / "spec-options"
    assert "Exception ignored" not in (candidate / "inductor.log").read_text(), "the interrupt was dropped"
    assert not (candidate / "sources").exists(), "AOTInductor was stopped before it finished"


def test_a_stopped_build_stores_nothing_in_the_cache(tmp_path, monkeypatch):
    from pipeline.services import cache, progress

    artifact = tmp_path / "model.so"
    artifact.write_bytes(b"compiled")
    monkeypatch.setattr(progress, "stop_requested", ["SIGINT"])  # what the signal handler records
    store = cache.Cache(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        store.store("key", (artifact,))
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
