"""The /opt link (runtime side) and the build's claim on the output folder (pipeline side)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.errors import OutputDirError
from pipeline.outdir import MARKER, claim_output_dir
from pipeline.templates import _load_runtime_module

link_module = _load_runtime_module("_link")


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
    threads = [threading.Thread(target=lambda: results.append(link_module.ensure_link(link, artifacts))) for _ in range(8)]
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
        with pytest.raises(OutputDirError, match="another build is writing"):
            with claim_output_dir(out):
                pass
        assert out.is_dir(), "the refused claim must not remove the holder's folder"
        assert (out.parent / ".cpu.build.lock").exists(), "nor the holder's lock file"
