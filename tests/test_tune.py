"""The compile-option search: every candidate is verified and timed; the fastest passing one ships."""

from __future__ import annotations

import json
import zipfile

from .conftest import TINY_SPEC, run_cli


def test_search_tries_candidates_and_records_the_choice(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text().replace("search = false", "search = true"))
    (tmp_path / "tiny_model.py").write_text((TINY_SPEC.parent / "tiny_model.py").read_text())
    ran = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist"),
                  "--build-dir", str(tmp_path / "build"))
    assert ran.code == 0, ran.err
    names = ["spec-options", "freezing", "freezing+channels-last", "max-autotune"]
    for name in names:
        assert f"    candidate {name}: " in ran.err
    report = json.loads(next((tmp_path / "dist").glob("*.report.json")).read_text())
    search = report["compile_search"]
    assert [c["name"] for c in search["candidates"]] == names
    passed = [c for c in search["candidates"] if c["passed"]]
    assert passed and all(c["median_ms"] > 0 for c in passed)
    assert search["chosen"] == min(passed, key=lambda c: c["median_ms"])["name"]
    with zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))) as archive:
        manifest = json.loads(archive.read("model_tiny/manifest.json"))
    assert manifest["compile_search"]["chosen"] == search["chosen"]
    assert [c["name"] for c in manifest["compile_search"]["candidates"]] == names
    assert "median_ms" not in json.dumps(manifest), "timings stay out of the wheel, which must be reproducible"
    chosen_options = next(c["options"] for c in search["candidates"] if c["name"] == search["chosen"])
    assert manifest["compile_options"] == chosen_options

    again = run_cli("build", "--spec", str(spec), "--root", str(tmp_path / "opt"), "--dist", str(tmp_path / "dist2"),
                    "--build-dir", str(tmp_path / "build"), "--version", "0.2")
    assert again.code == 0, again.err
    assert "(cached)" in again.err and "no export, no recompile" in again.err
