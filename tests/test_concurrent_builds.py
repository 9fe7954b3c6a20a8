"""Builds that run at once: several versions of one model, one work folder held by one build."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import OutputDirError

from .conftest import TINY_SPEC, start_cli, wheel_manifest

# -- several versions of one model built at once -----------------------------------------


def test_two_versions_built_at_once_both_succeed(dirs):
    """They shared build/<model>/<target>/ (wheel-src, candidates, sources, the trace): one removed
    the other's files, and a build failed with exit 9 and "report this as a bug"."""
    versions = ("0.2", "0.3")
    builds = [start_cli("build", "--spec", str(TINY_SPEC), "--version", v, *dirs.args()) for v in versions]
    finished = [(child.wait(timeout=600), child.stderr.read()) for child in builds]
    for version, (code, err) in zip(versions, finished):
        assert code == 0, f"--version {version}:\n{err}"
    sources = set()
    for version in versions:
        [wheel] = sorted(dirs.dist.glob(f"model_tiny-{version}+cpu.*.whl"))
        assert wheel_manifest(wheel)["opt_path"] == str(dirs.root / "tiny" / version / "cpu")
        report = json.loads(next(dirs.dist.glob(f"model_tiny-{version}+cpu.*.report.json")).read_text())
        sources.add(report["sources_dir"])
        assert report["sources_dir"].startswith(str(dirs.build / "tiny" / version / "cpu")), report["sources_dir"]
        assert report["trace_dir"] == str(dirs.build / "tiny" / version / "trace")
    assert len(sources) == 2
    assert [p for p in dirs.root.rglob("*") if not p.is_dir()] == [], "no folder or lock is left under the root"


def test_a_work_folder_is_held_by_one_build(tmp_path):
    """Two builds of one model, version and target into other roots but one --build-dir."""
    from pipeline.build import hold_work_dir
    from pipeline.services.layout import WorkLayout

    work = WorkLayout(tmp_path / "build").work_dir("tiny", "0.2", "cpu")
    with hold_work_dir(work):
        with pytest.raises(OutputDirError, match="another build is using the work folder") as info:
            with hold_work_dir(work):
                pass
        assert "--build-dir" in info.value.hint
    with hold_work_dir(work):  # released: the next build takes it
        pass
