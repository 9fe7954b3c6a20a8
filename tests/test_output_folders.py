"""--dist, --build-dir and --root that are files, read-only or full are refused before any work;
a disk that fills up while writing leaves nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipeline.errors import OutputDirError

from .conftest import TINY_SPEC, Ran, copy_compiled, run_cli, tmpfs

# -- --dist or --build-dir that is a file, read-only, or on a full disk -------------------


def build_into(tmp_path: Path, dist: Path, build: Path, spec: Path = TINY_SPEC) -> Ran:
    return run_cli(
        "build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(dist), "--build-dir", str(build)
    )


def refused_early(ran: Ran, tmp_path: Path, says: str) -> None:
    assert ran.code == OutputDirError.exit_code, ran.err
    assert says in ran.err, ran.err
    assert "\nhint: " in ran.err and "Traceback" not in ran.err
    assert "==> load" not in ran.err, "refused before any work"
    assert not (tmp_path / "opt").exists()


@pytest.mark.parametrize("flag", ["--dist", "--build-dir"])
def test_a_file_given_as_a_folder_is_refused_before_building(tmp_path, flag):
    """--dist pointing at a file failed after compiling, with a FileExistsError traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    dist, build = (a_file, tmp_path / "build") if flag == "--dist" else (tmp_path / "dist", a_file)
    ran = build_into(tmp_path, dist, build)
    refused_early(ran, tmp_path, f"error: {flag} {a_file} is a file, not a folder")
    ran = build_into(tmp_path, dist / "sub", build / "sub")
    refused_early(ran, tmp_path, f"error: {flag} {a_file / 'sub'} cannot be made: {a_file} is a file, not a folder")
    assert a_file.read_text() == "not a folder"
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()


@pytest.mark.parametrize("flag", ["--dist", "--build-dir", "--root"])
def test_a_read_only_folder_is_refused_before_building(tmp_path, flag):
    """--root too: an unwritable root was reported only after load, doctor and export (exit 10)."""
    with tmpfs(tmp_path / "read-only", 1 << 20, read_only=True) as read_only:
        folders = {
            "--dist": tmp_path / "dist",
            "--build-dir": tmp_path / "build",
            "--root": tmp_path / "opt",
            flag: read_only / "here",
        }
        ran = run_cli("build", "--spec", str(TINY_SPEC), *(a for pair in folders.items() for a in map(str, pair)))
        refused_early(ran, tmp_path, f"{folders[flag]}: cannot write there (it would be made in {read_only})")
        assert f"error: {flag}" in ran.err and "Read-only file system" in ran.err
        assert "hint: give " + flag in ran.err


def test_a_full_disk_is_refused_before_building(tmp_path):
    with tmpfs(tmp_path / "full", 64 << 10) as full:
        (full / "filler").write_bytes(b"\0" * (64 << 10))
        ran = build_into(tmp_path, full / "dist", tmp_path / "build")
        refused_early(
            ran,
            tmp_path,
            f"error: --dist {full / 'dist'}: cannot write there (it would be made in {full}): No space left on device",
        )
        assert sorted(p.name for p in full.iterdir()) == ["filler"]


def test_dist_filling_up_while_the_wheel_is_written_leaves_nothing(tmp_path, tiny_build, warm_dirs):
    """The report fitted and the wheel did not: an orphan report.json was left in dist/. The
    subject is packaging, after the compile: warm_dirs' cache holds the compiled model."""
    wheel = next(tiny_build[0].dist.glob("*.whl"))
    with tmpfs(tmp_path / "dist", wheel.stat().st_size // 2) as dist:  # room for the report, not the wheel
        ran = build_into(tmp_path, dist, warm_dirs.build)
        assert "reused the compiled model from build cache" in ran.err, ran.err
        assert ran.code == OutputDirError.exit_code, ran.err
        assert f"error: cannot write {dist}/.{wheel.name}.partial-" in ran.err and "No space left on device" in ran.err
        assert f"hint: free space on the disk holding {dist}" in ran.err and "Traceback" not in ran.err
        assert list(dist.iterdir()) == [], "no report without its wheel, no hidden partial file"
    cache = tmp_path / "build" / "cache"
    assert not [p.name for p in cache.iterdir() if p.name.startswith("build-")], "no build entry without its wheel"
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".")], "no partial entry"
    assert not (tmp_path / "opt").exists()


@pytest.mark.parametrize("room", ["none", "for-the-compiled-model"])
def test_build_cache_filling_up_leaves_no_partial_entry(tmp_path, tiny_build, room):
    """A full disk under --build-dir while the cache entry was written left half an entry."""
    built = tiny_build[0]
    so_size = next(built.build.glob("cache/*/model.so")).stat().st_size
    wheel_size = next(built.dist.glob("*.whl")).stat().st_size
    # "none": the compiled model's entry does not fit; else it fits, and the whole build's
    # (the wheel again, stored last) does not.
    size = so_size // 2 if room == "none" else so_size + wheel_size // 2
    with tmpfs(tmp_path / "build" / "cache", size) as cache:
        if room == "for-the-compiled-model":  # that entry there already (a compile less): the whole build's fails
            copy_compiled(built.build / "cache", cache)
        ran = build_into(tmp_path, tmp_path / "dist", tmp_path / "build")
        assert ran.code == OutputDirError.exit_code, ran.err
        assert f"error: cannot write {cache}/." in ran.err and "No space left on device" in ran.err, ran.err
        assert "Traceback" not in ran.err
        entries = sorted(p.name for p in cache.iterdir())
        assert not [name for name in entries if name.startswith(".")], entries
        assert not [name for name in entries if name.startswith("build-")], entries
        if room == "for-the-compiled-model":
            assert len(entries) == 1 and (cache / entries[0] / "model.so").is_file(), "whole entries are kept"
            assert "==> package" in ran.err, "it failed storing the whole build, last"
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []
    assert not (tmp_path / "opt").exists()


def test_partial_files_of_a_build_killed_while_writing_are_swept(tmp_path):
    from pipeline.services.writable import sweep_partials

    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f".model_tiny-0.1.whl.partial-{gone.pid}").write_bytes(b"half")
    (tmp_path / f".build-abc.partial-{gone.pid}").mkdir()
    (tmp_path / f".build-abc.partial-{gone.pid}" / "model.so").write_bytes(b"half")
    running = tmp_path / f".build-def.partial-{os.getppid()}"  # a live process's: left to it
    running.mkdir()
    sweep_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name]


def test_a_compiler_that_ran_out_of_disk_is_said_as_a_full_disk():
    """A newcomer's candidates were dropped as "C++ compile error" when g++ filled /tmp: the
    compiler's own output, as AOTInductor's error carries it, is the build's full-disk error."""
    from pipeline.services import writable

    output = (
        "AOTInductor failed: InductorError: CppCompileError: C++ compile error\n\nCommand:\ng++ x.wrapper.cpp\n\n"
        "Output:\nx.wrapper.cpp:1041:1: fatal error: error writing to /tmp/ccNDoxDg.s: No space left on device\n"
    )
    full = writable.disk_full(output)
    assert full is not None and full.exit_code == OutputDirError.exit_code
    assert str(full) == "cannot write /tmp/ccNDoxDg.s: No space left on device"
    assert full.hint.startswith("free space on the disk holding /tmp (df -h /tmp)")
    assert writable.disk_full("CppCompileError: C++ compile error\nerror: 'x' was not declared") is None


def test_a_compile_whose_folder_was_removed_meanwhile_is_said_as_such(tmp_path):
    """H61: another user's `rm -rf` of the shared root while a build held it dropped two candidates as
    "C++ compile error", then failed 4 minutes later with "No such file or directory". A failed compile
    whose folder is gone stops the build, saying what was removed."""
    from types import SimpleNamespace

    from pipeline.features import parallel, search

    held = tmp_path / "opt" / "unet" / "1.3" / "cpu"
    plan = SimpleNamespace(compile_dir=held / ".candidates" / "freezing", options={})
    held.mkdir(parents=True)
    failed = parallel.Done("freezing", 12.0, "AOTInductor failed: CppCompileError: C++ compile error")
    args = (None, 1, "freezing", plan, "2/3 freezing", False, None, tmp_path / "work", None, None, failed)
    with pytest.raises(OutputDirError) as caught:  # the folder gone, with its parents up to the root's
        search._compile_and_verify(*args)
    assert caught.value.message == (
        f"{held / '.candidates'} was removed while this build used it (by another process?): its compile failed "
        f"for want of {plan.compile_dir}"
    )
    assert caught.value.hint.startswith("build again; where others use the same root, build into one of your own")
    (tmp_path / "opt").rename(tmp_path / "gone")
    with pytest.raises(OutputDirError) as caught:
        search._compile_and_verify(*args)
    assert caught.value.message.startswith(f"{tmp_path / 'opt'} was removed while this build used it")
    # where the folder is there, the failure is the candidate's: dropped, as before
    plan.compile_dir.mkdir(parents=True)
    trial, error = search._compile_and_verify(*args)
    assert not trial.passed and error is None


def test_a_held_output_folder_another_process_removed_is_said_as_such(tmp_path):
    """H63: `rm -rf <root>/tiny` during a build ended in "cannot write …/.cpu.removing-17494: No such file
    or directory", a file the user never made. Where the build fails, the removal is its error; where the
    build finished (its wheel carries the files), there is nothing left to remove, and nothing is said."""
    import shutil

    from pipeline.services import progress
    from pipeline.services.outdir import claim_output_dir

    out = tmp_path / "root" / "tiny" / "0.2" / "cpu"
    with progress.reporting(progress.QuietProgress(result_stream=None)):
        with pytest.raises(OutputDirError) as caught, claim_output_dir(out):
            shutil.rmtree(tmp_path / "root" / "tiny")
            raise FileNotFoundError(2, "No such file or directory", str(out / "model.so"))
        assert caught.value.message == (
            f"{tmp_path / 'root' / 'tiny'} was removed while this build used it (by another process?): the build "
            f"failed for want of {out}"
        )
        assert isinstance(caught.value.__context__, FileNotFoundError)
        with claim_output_dir(out):  # the build done: nothing to remove, and no error
            shutil.rmtree(tmp_path / "root" / "tiny")
        assert not (tmp_path / "root" / "tiny").exists()
