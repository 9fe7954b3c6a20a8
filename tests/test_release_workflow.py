"""The release workflow as CI runs it: each job's own `run:` steps, read out of release.yml itself,
run in a fresh venv that holds only what the job installs (the stand-in for setup-python), in a
copy of the checkout (the stand-in for actions/checkout), so the file and this test cannot drift.

The chain is the real one on a spec with two targets: `matrix` gives one job per target, the cpu
job builds only cpu (for the portable CPU kind the workflow sets), and `publish` uploads its wheel
to a local index, then passes over it when the release is run again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from pipeline.targets import cuda

from .conftest import REPO, checkout_copy, make_venv, pip_install, run_cli

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# The two shapes of expression the workflow's run steps and conditions use beyond a plain lookup.
CHOICE = re.compile(r"^([\w.]+) && '([^']*)' \|\| '([^']*)'$")
COMPARISON = re.compile(r"^([\w.]+) (==|!=) '([^']*)'$")


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def evaluate(expression: str, context: dict):
    """The value of a GitHub expression of the forms the workflow uses; an unknown name fails the test."""
    if match := CHOICE.match(expression):
        return match[2] if lookup(match[1], context) else match[3]
    if match := COMPARISON.match(expression):
        equal = str(lookup(match[1], context)) == match[3]
        return equal if match[2] == "==" else not equal
    return lookup(expression, context)


def lookup(name: str, context: dict):
    value = context
    for part in name.split("."):
        assert isinstance(value, dict) and part in value, (
            f"release.yml uses ${{{{ {name} }}}}, which this test does not provide"
        )
        value = value[part]
    return value


def expand(text: str, context: dict) -> str:
    return EXPRESSION.sub(lambda match: str(evaluate(match[1], context)), text)


def run_job(name: str, context: dict, workspace: Path, python: Path, tmp: Path) -> subprocess.CompletedProcess:
    """Every `run:` step of the job whose `if:` holds, in order, as the runner runs them: bash -e,
    in the workspace, with the workflow's, the job's and the step's env, `python` first on PATH."""
    document = workflow()
    job = document["jobs"][name]
    output = tmp / f"{name}.output"
    output.write_text("")
    env = {
        **os.environ,
        "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_OUTPUT": str(output),
        "GITHUB_PATH": str(tmp / "path"),
        "CI": "true",
        # pip's --no-compile (its "no-" variables read inverted): the build job's `make venv` would
        # byte-compile all of torch (25 CPU-s here) for the one build process that follows.
        "PIP_NO_COMPILE": "0",
    }
    env.pop("VIRTUAL_ENV", None)
    for scope in (document, job):
        env.update({key: expand(str(value), context) for key, value in scope.get("env", {}).items()})
    done = subprocess.CompletedProcess([], 0, "", "")
    for step in job["steps"]:
        if "run" not in step or not evaluate(EXPRESSION.sub(r"\1", step.get("if", "true")), {**context, "true": True}):
            continue
        step_env = {**env, **{key: expand(str(value), context) for key, value in step.get("env", {}).items()}}
        done = subprocess.run(
            ["bash", "-e", "-c", expand(step["run"], context)],
            cwd=workspace,
            env=step_env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert done.returncode == 0, (
            f"job {name}, step {step.get('name') or step['run'][:60]!r}:\n{done.stdout}{done.stderr}"
        )
    return done


def outputs(tmp: Path, job: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (tmp / f"{job}.output").read_text().splitlines() if "=" in line)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The checkout as actions/checkout gives it, with one model: the tiny one, for both targets."""
    return checkout_copy(tmp_path_factory.mktemp("workspace") / "repo", ("cpu", "cuda"))


@pytest.fixture(scope="module")
def matrix_python(tmp_path_factory) -> Path:
    """The matrix job's setup-python: no torch. Both of the file's runs of that job use it, as a
    re-run job would: the second run's install step finds what the first installed, and the venv
    holds nothing else."""
    return make_venv(tmp_path_factory.mktemp("matrix-python") / "python", sees_torch=False)


@pytest.fixture(scope="module")
def matrix(workspace, matrix_python, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("matrix")
    run_job("matrix", {"inputs": {"no_containers": True}}, workspace, matrix_python, tmp)
    return json.loads(outputs(tmp, "matrix")["matrix"])


@pytest.fixture(scope="module")
def built(workspace, matrix, tmp_path_factory) -> Path:
    """The cpu job's steps, on its matrix entry; returns the wheel it left in dist/."""
    tmp = tmp_path_factory.mktemp("build")
    python = make_venv(tmp / "python", sees_torch=False)  # setup-python's: make builds .venv from it
    job = next(entry for entry in matrix["include"] if entry["target"] == "cpu")
    run_job("build", {"matrix": job}, workspace, python, tmp)
    wheels = sorted((workspace / "dist").glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].name.startswith("model_tiny-0.1+cpu.torch"), wheels  # no cuda wheel tried
    return wheels[0]


def test_the_matrix_job_gives_one_job_per_target_with_only_its_own_install_line(
    matrix, matrix_python, workspace, tmp_path
):
    # The local run (no_containers) builds on this machine: cuda only where it has the NVIDIA driver.
    here = [("tiny", "cuda")] if cuda.runner_missing() is None else []
    assert [(entry["model"], entry["target"]) for entry in matrix["include"]] == [("tiny", "cpu"), *here]
    assert all(entry["container"] == "" for entry in matrix["include"])  # the local run: on the runner itself
    run_job("matrix", {"inputs": {"no_containers": False}}, workspace, matrix_python, tmp_path)
    jobs = {entry["target"]: entry for entry in json.loads(outputs(tmp_path, "matrix")["matrix"])["include"]}
    assert "manylinux_2_28" in jobs["cpu"]["container"] and jobs["cpu"]["torch_variant"] == "cpu"
    assert "manylinux2_28" in jobs["cuda"]["container"] and "--gpus" in jobs["cuda"]["container_options"]
    assert jobs["cuda"]["runner"] != jobs["cpu"]["runner"] and jobs["cuda"]["torch_variant"].startswith("cu")


def test_the_cpu_job_builds_only_cpu_for_the_portable_cpu_kind(built, workspace):
    with zipfile.ZipFile(built) as archive:
        manifest = json.loads(archive.read("model_tiny/manifest.json"))
    assert manifest["target"] == "cpu" and manifest["variant"] == "cpu"
    assert manifest["platform"]["cpu_capability"] == "AVX2", manifest["platform"]
    assert (
        workspace / "dist" / f"model_tiny-0.1+cpu.torch{manifest['torch']['version'].split('+')[0]}.report.json"
    ).is_file()
    assert (workspace / "build" / "tiny" / "0.1" / "trace").is_dir(), "the trace the workflow uploads"


@pytest.fixture(scope="module")
def built_installed(built, tmp_path_factory) -> Path:
    """A venv with the cpu job's wheel installed by pip (this suite's torch its pinned one); the
    tests below only run it."""
    python = make_venv(tmp_path_factory.mktemp("built-installed") / "env")
    pip_install(python, str(built))
    return python


def test_a_wheel_built_for_avx2_loads_where_torch_runs_avx2_kernels(built_installed):
    ran = subprocess.run(
        [
            str(built_installed),
            "-c",
            "import model_tiny as m; print(m.load()(*m.example_inputs())[1].shape); "
            "print(m.load_numpy()(*[t.numpy() for t in m.example_inputs()])[1].shape)",
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["torch.Size([2,", "4])", "(2,", "4)"]


def test_the_portable_wheel_runs_onednn_at_the_kind_it_packed_its_weights_for(built_installed):
    """Its weights are packed in AVX2's blocked layouts. On a CPU with more (AVX-512), an uncapped
    oneDNN runs its own kernels and reorders every packed weight on every call (the unet: 254 ms
    a call against 41): the runtime holds oneDNN at AVX2, unless the user set a cap of their own."""
    python = built_installed
    code = (
        "import os, model_tiny as m; model = m.load(); model(*m.example_inputs()); "
        "print('cap', os.environ.get('ONEDNN_MAX_CPU_ISA'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    ran = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd="/", env={**env, "ONEDNN_VERBOSE": "1"}
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "cap AVX2"
    kernels = [line for line in ran.stdout.splitlines() if line.startswith("onednn_verbose") and ",exec,cpu," in line]
    assert kernels and not [line for line in kernels if "avx512" in line or "amx" in line], kernels[:5]
    own = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd="/", env={**env, "ONEDNN_MAX_CPU_ISA": "SSE41"}
    )
    assert own.returncode == 0, own.stderr
    assert own.stdout.splitlines()[-1] == "cap SSE41"


@pytest.fixture
def index(tmp_path):
    started = run_cli("index", "start", "--port", "0", "--data", str(tmp_path / "data"), cwd=tmp_path)
    assert started.code == 0, started.err
    yield json.loads((tmp_path / "build" / "index" / "state.json").read_text())["url"], tmp_path / "data"
    run_cli("index", "stop", cwd=tmp_path)


def test_the_publish_job_uploads_with_its_own_install_line_and_passes_on_a_rerun(built, workspace, index, tmp_path):
    url, data = index
    # MODELWHEEL_SIMPLE_URL: where --skip-existing reads the simple pages (a wrong one would 404).
    secrets = {
        "MODELWHEEL_INDEX_URL": url,
        "MODELWHEEL_INDEX_USERNAME": "local",
        "MODELWHEEL_INDEX_PASSWORD": "no-auth",
        "MODELWHEEL_SIMPLE_URL": f"{url}{{target}}/simple/",
    }
    python = make_venv(
        tmp_path / "python", sees_torch=False
    )  # no torch, no numpy: what the job installs and nothing else
    first = run_job("publish", {"secrets": secrets}, workspace, python, tmp_path)
    assert f"{built.name}: uploaded to the cpu index" in first.stderr
    assert (data / "cpu" / built.name).is_file()
    again = run_job("publish", {"secrets": secrets}, workspace, python, tmp_path)  # a re-run release
    assert f"{built.name}: already on the index (cpu), the same file, left as it is" in again.stderr
    installed = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'), u.find_spec('numpy'))"],
        capture_output=True,
        text=True,
    )
    assert installed.stdout.split() == ["None", "None"]


def test_the_workflows_steps_never_see_the_make_that_runs_the_tests(tmp_path):
    """`make test ARGS="..."` must not reach the workflow's own `make build` (it once handed pytest's
    ARGS to modelwheel): with the tests' fixtures loaded, neither ARGS nor MAKEFLAGS is left."""
    makefile = tmp_path / "Makefile"
    shown = (
        "import json, os, tests.conftest; "
        "print(json.dumps([os.environ.get(n) for n in ('ARGS', 'MODEL', 'MAKEFLAGS')]))"
    )
    makefile.write_text(f'show:\n\t@{sys.executable} -c "{shown}"\n')
    ran = subprocess.run(
        ["make", "-f", str(makefile), "ARGS=tests/x.py -k 'a b'", "MODEL=tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [None, None, None]
