"""What release.yml and the matrix decide before any job builds, checked in seconds: the tools the
jobs install are pinned as requirements.txt pins them, the matrix refuses the local-run input on
GitHub's runners and leaves a target this machine cannot build out of a local run (saying why),
and the unet is released for cuda too. tests/test_release_workflow.py runs the jobs themselves."""

from __future__ import annotations

import json
import re
import shlex
import shutil

import pytest
import yaml

from pipeline import targets
from pipeline.targets import cuda

from .conftest import GOOD, REPO, TINY_SPEC, run_cli, spec_copy

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
CONSTRAINTS = "requirements-release.txt"


def pins(path) -> dict[str, str]:
    """``name==version`` lines (comments and options left out), by pip's normalised name."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            found[re.sub(r"[-_.]+", "-", name).lower().strip()] = version.strip()
    return found


def install_lines() -> list[list[str]]:
    """Every `pip install` command in the workflow's run steps, split as bash would."""
    steps = [step for job in yaml.safe_load(WORKFLOW.read_text())["jobs"].values() for step in job["steps"]]
    return [shlex.split(line) for step in steps for line in step.get("run", "").splitlines() if "pip install" in line]


def test_the_jobs_install_only_tools_pinned_at_the_versions_of_requirements_txt():
    wanted, release = pins(REPO / "requirements.txt"), pins(REPO / CONSTRAINTS)
    assert {name: version for name, version in release.items() if wanted.get(name) != version} == {}, (
        f"{CONSTRAINTS} must pin what requirements.txt pins"
    )
    lines = install_lines()
    assert len(lines) == 2, lines  # the matrix job's and the publish job's
    for words in lines:
        assert words[words.index("-c") + 1] == CONSTRAINTS, words
        named = [w for w in words[words.index("install") + 1 :] if not w.startswith("-") and w != CONSTRAINTS]
        assert named and all(name in release for name in named), f"{named}: each must be pinned in {CONSTRAINTS}"
    assert {"pydantic", "packaging", "twine"} <= set(release)


def test_the_matrix_refuses_the_local_run_input_on_githubs_runners(tmp_path):
    refused = run_cli("matrix", "--no-containers", "--spec", str(TINY_SPEC), env={"GITHUB_ACTIONS": "true", "ACT": ""})
    assert refused.code == 2 and refused.out == ""
    assert refused.err.splitlines() == [
        "error: --no-containers (the release's no_containers input) is for a local run under act: on GitHub's "
        "runners it would build on the runner's own glibc and publish wheels tagged narrower than the "
        "manylinux_2_28 ones, under the same version",
        "hint: run the release on GitHub without no_containers; `make release-local` is the run that uses it",
    ]
    under_act = run_cli(
        "matrix", "--no-containers", "--spec", str(TINY_SPEC), env={"GITHUB_ACTIONS": "true", "ACT": "true"}
    )
    assert under_act.code == 0, under_act.err
    assert run_cli("matrix", "--spec", str(TINY_SPEC), env={"GITHUB_ACTIONS": "true", "ACT": ""}).code == 0


def test_a_local_run_leaves_out_the_cuda_job_where_there_is_no_driver_and_says_so(tmp_path):
    spec = spec_copy(tmp_path / "m", GOOD + '\n[build]\ntargets = ["cpu", "cuda"]\n')
    no_driver = {"PATH": str(tmp_path / "empty")}  # no nvidia-smi: a machine without the NVIDIA driver
    local = run_cli("matrix", "--no-containers", "--spec", str(spec), env=no_driver)
    assert local.code == 0, local.err
    assert [entry["target"] for entry in json.loads(local.out)["include"]] == ["cpu"]
    assert local.err.splitlines() == [
        "matrix: build tiny (cuda) is left out of this local run: no NVIDIA driver here (nvidia-smi is not on PATH); "
        "on GitHub it runs on its own runner (self-hosted, linux, gpu: docs/publishing.md)"
    ]
    release = run_cli("matrix", "--spec", str(spec), env=no_driver)  # GitHub's: every job, each on its runner
    assert [entry["target"] for entry in json.loads(release.out)["include"]] == ["cpu", "cuda"]


def test_the_unet_is_released_for_cuda_too():
    ran = run_cli("matrix", "--spec", "models/unet/spec.toml")
    assert ran.code == 0, ran.err
    jobs = {entry["target"]: entry for entry in json.loads(ran.out)["include"]}
    assert sorted(jobs) == ["cpu", "cuda"] and jobs["cuda"]["torch_variant"] == "cu130"


def test_the_docs_state_no_glibc_version_for_ubuntu_latest():
    text = (REPO / "docs" / "publishing.md").read_text()
    assert not re.search(r"glibc[^.]*\(?\d\.\d+", text.replace("manylinux_2_28", "")), "ubuntu-latest moves on"


def test_a_spec_naming_cuda_too_builds_its_cpu_wheel_where_there_is_no_gpu():
    """The unet names cpu and cuda for the release: `make build MODEL=unet` on a CPU machine still
    builds its cpu wheel, and says what it left out. A spec naming only what is missing is refused."""
    if cuda.unavailable() is None:
        pytest.skip("this machine builds cuda")
    notes = []
    assert targets.buildable_here(["cpu", "cuda"], notes.append) == ["cpu"]
    assert notes == [
        f"note: target cuda skipped, not built on this machine: {cuda.unavailable()} (the spec names it for "
        "machines that have it; --target cuda asks for it)"
    ]
    assert targets.buildable_here(["cuda"], notes.append) == ["cuda"] and len(notes) == 1  # require_available refuses


def test_the_publish_job_hands_publish_the_simple_page_url():
    """On registries whose upload and simple URLs differ, --skip-existing must read the right page."""
    publish = yaml.safe_load(WORKFLOW.read_text())["jobs"]["publish"]
    step = next(s for s in publish["steps"] if "pipeline publish --skip-existing" in s.get("run", ""))
    assert step["env"]["MODELWHEEL_SIMPLE_URL"] == "${{ secrets.MODELWHEEL_SIMPLE_URL }}"


def test_publishing_the_wheels_dist_holds_says_nothing_of_the_targets_a_build_would_skip(tiny_build, tmp_path):
    """The skipped-target note belongs to a build: `make publish` of wheels already built printed it too,
    where it reads like a failure of the publish."""
    if cuda.unavailable() is None:
        pytest.skip("this machine builds cuda")
    spec = spec_copy(tmp_path / "spec", GOOD + '\n[build]\ntargets = ["cpu", "cuda"]\n')
    shutil.copytree(tiny_build[0].dist, tmp_path / "dist")
    ran = run_cli("publish", "--spec", str(spec), "--dist", str(tmp_path / "dist"), "--index", "http://127.0.0.1:9/")
    assert "==> publish: model_tiny-0.1+cpu" in ran.err, ran.err  # dist/'s wheel found: no build
    assert "target cuda" not in ran.err and "building it" not in ran.err, ran.err
    assert ran.code != 0  # nothing listens there: the upload itself fails, after what this test checks
