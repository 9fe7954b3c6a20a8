"""What publish refuses before anything is uploaded: a renamed wheel, a damaged manifest."""

from __future__ import annotations

import shutil

import pytest

from .conftest import run_cli
from .test_publish import rewrite

NOWHERE = "http://127.0.0.1:9/"  # nothing listens there: a refusal must come before any connection


@pytest.mark.parametrize(("name", "said"), [("model_other", "model-other 0.1"), ("model_tiny-0.9", "model-tiny 0.9")])
def test_a_renamed_wheel_is_refused_naming_both_names(wheel, tmp_path, name, said):
    """The tiny wheel copied as model_other-0.1-... or model_tiny-0.9-... (RECORD untouched) was
    uploaded with exit 0, and the index held that name and version for good."""
    label = wheel.name.split("-", 2)[1].partition("+")[2]
    renamed = tmp_path / wheel.name.replace("model_tiny-0.1", name if "-" in name else f"{name}-0.1")
    shutil.copy(wheel, renamed)
    ran = run_cli("publish", "--wheel", str(renamed), "--index", NOWHERE, cwd=tmp_path)
    assert ran.code == 15, ran.err
    assert (f"error: {renamed}: a renamed wheel: its file name says {said}+{label}, its METADATA "
            f"(model_tiny-0.1+{label}.dist-info/METADATA) says model-tiny 0.1+{label}, its manifest says "
            f"model-tiny 0.1+{label}") in ran.err
    assert f"hint: publish the file under the name its build gave it (model_tiny-0.1+{label}-...whl)" in ran.err


@pytest.mark.parametrize(("manifest", "says"), [
    (b"{not json", "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"[]", "is a JSON list, not a manifest"),
    (b'{"verification": {"passed": true}}', "is not a manifest of this pipeline: import_name, dist_name, full_version, "
                                             "artifacts, golden missing or of the wrong type"),
])
def test_a_damaged_manifest_with_a_consistent_record_is_refused_naming_it(wheel, tmp_path, manifest, says):
    """A wheel whose manifest.json is damaged but listed in its RECORD with its own hash gave a
    traceback (JSONDecodeError, AttributeError) and exit 1."""
    (tmp_path / "out").mkdir()
    damaged = rewrite(wheel, tmp_path / "out", lambda name, data: manifest if name == "model_tiny/manifest.json" else data,
                      rerecord=True)
    ran = run_cli("publish", "--wheel", str(damaged), "--index", NOWHERE, cwd=tmp_path)
    assert ran.code == 15, ran.err
    assert f"error: {damaged}: model_tiny/manifest.json {says}" in ran.err
    assert "Traceback" not in ran.err
