"""Small ends: a link a killed build moved aside is put back, parallel logs are named, links of
uninstalled versions are swept."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.services.outdir import claim_output_dir

from .conftest import REPO, run_cli
from .test_end_to_end import manifest_of

# --- small ones: a link left aside, the log folder named, dangling links swept, no colour codes ---


def test_link_moved_aside_by_a_killed_build_is_put_back_by_the_next(tmp_path):
    installed = tmp_path / "site-packages" / "model_x" / "artifacts"
    installed.mkdir(parents=True)
    path = tmp_path / "opt" / "x" / "1.0" / "cpu"
    path.parent.mkdir(parents=True)
    path.symlink_to(installed, target_is_directory=True)
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\nfrom pathlib import Path\n"
            "from pipeline.services.outdir import claim_output_dir\n"
            "with claim_output_dir(Path(sys.argv[1])):\n    os.kill(os.getpid(), signal.SIGKILL)",
            str(path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert list(path.parent.glob(".cpu.displaced-*")), "a build killed outright leaves the installed link aside"
    with claim_output_dir(path) as claimed:
        assert claimed.is_dir() and not claimed.is_symlink()
    assert path.is_symlink() and path.resolve() == installed.resolve(), "the next build puts the link back"
    assert sorted(p.name for p in path.parent.iterdir()) == ["cpu"]


def _bad_specs(tmp_path: Path, count: int) -> list[str]:
    specs = [tmp_path / f"bad{index}.toml" for index in range(count)]
    for spec in specs:
        spec.write_text("[model\n")  # malformed TOML: each build fails at once (exit 3)
    return [str(spec) for spec in specs]


def test_parallel_build_failures_name_the_real_log_folder(tmp_path):
    build_dir = tmp_path / "elsewhere"
    specs = [a for spec in _bad_specs(tmp_path, 2) for a in ("--spec", spec)]
    ran = run_cli(
        "build",
        *specs,
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(build_dir),
    )
    assert ran.code == 1 and "2 build(s) failed" in ran.err, ran.err
    assert f"hint: each build's log is in {build_dir / 'logs'}/" in ran.err


def test_one_failed_build_names_its_log_file(tmp_path):
    import io

    from pipeline.errors import PipelineError
    from pipeline.services.parallel import build_many
    from pipeline.services.progress import Progress

    (spec,) = _bad_specs(tmp_path, 1)
    with pytest.raises(PipelineError) as failed:
        build_many([spec], [], 1, tmp_path / "elsewhere" / "logs", Progress(io.StringIO()), {})
    assert failed.value.exit_code == 3
    log = tmp_path / "elsewhere" / "logs" / f"{tmp_path.name}-bad0.log"
    assert failed.value.hint == f"its log is {log}" and log.is_file()


def test_link_sweeps_links_left_by_uninstalled_versions_of_the_same_model(installed, wheel, tmp_path):
    opt_path = Path(manifest_of(wheel)["opt_path"])  # <root>/tiny/0.1/cpu
    model_dir, root = opt_path.parents[1], opt_path.parents[2]
    gone = tmp_path / "old-venv" / "lib" / "python3.11" / "site-packages"
    uninstalled = model_dir / "0.0" / "cpu"  # what `pip uninstall model-tiny` of 0.0 leaves: a dangling link
    foreign = model_dir / "0.0" / "cuda"  # dangling, but not made by a model_tiny runtime
    other_model = root / "other" / "0.1" / "cpu"  # another model's: not this load's to sweep
    for link, target in (
        (uninstalled, gone / "model_tiny" / "artifacts"),
        (foreign, tmp_path / "elsewhere"),
        (other_model, gone / "model_other" / "artifacts"),
    ):
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    try:
        # A CPU wheel's load() writes nothing; `link` (and a CUDA wheel's load()) sweeps
        ran = subprocess.run([str(installed.parent / "model-tiny"), "link"], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        assert f"removed {uninstalled}" in ran.stdout
        assert not uninstalled.is_symlink(), "the dangling link of an uninstalled version is removed"
        assert foreign.is_symlink() and other_model.is_symlink()
        assert opt_path.is_symlink() and opt_path.exists()
    finally:
        shutil.rmtree(model_dir / "0.0", ignore_errors=True)
        shutil.rmtree(root / "other", ignore_errors=True)
