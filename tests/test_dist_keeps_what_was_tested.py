"""dist/ keeps the wheel that was tested: a rebuild of the same version with other contents is
refused (it silently replaced the wheel before), unless --overwrite says to replace it."""

from __future__ import annotations

import shutil

from pipeline.errors import OutputDirError
from pipeline.services.manifest import sha256_file

from .conftest import TINY_SPEC, run_cli


def test_a_changed_model_under_the_same_version_does_not_replace_the_tested_wheel(tmp_path, tiny_build):
    built, _ = tiny_build
    dist = tmp_path / "dist"
    shutil.copytree(built.dist, dist)
    wheel = next(dist.glob("*.whl"))
    tested = sha256_file(wheel)
    spec = tmp_path / "spec" / "spec.toml"
    shutil.copytree(TINY_SPEC.parent, spec.parent)
    spec.write_text(spec.read_text().replace("kwargs = { channels = 8 }", "kwargs = { channels = 6 }"))
    args = [
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(dist),
        "--build-dir",
        str(tmp_path / "build"),
    ]
    refused = run_cli(*args)
    assert refused.code == OutputDirError.exit_code, refused.err
    assert f"error: {wheel} already holds a different build of this version" in refused.err
    assert "hint: bump model.version" in refused.err and "--overwrite" in refused.err
    assert sha256_file(wheel) == tested and sorted(p.name for p in dist.iterdir()) == sorted(
        p.name for p in built.dist.iterdir()
    )
    replaced = run_cli(*args, "--overwrite")
    assert replaced.code == 0, replaced.err
    assert sha256_file(wheel) != tested
