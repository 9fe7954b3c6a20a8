"""modelwheel as a package: `pip install .` (not editable) into a fresh venv, then the `modelwheel`
command builds a spec kept anywhere, from any folder; the command line a user meets."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from pipeline.hf_tasks import TESTED_LIBRARIES

from .conftest import REPO, TINY_SPEC, make_venv, pip_install, run_cli
from .test_hf_build import save_vit


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory) -> Path:
    """A fresh venv (torch, no transformers or diffusers) with modelwheel installed by `pip install .`."""
    python = make_venv(tmp_path_factory.mktemp("tool") / "env")
    pip_install(python, str(REPO), f"torch=={importlib.metadata.version('torch')}")  # the torch of this suite
    return python


def test_an_installed_modelwheel_builds_a_spec_kept_anywhere_from_any_folder(tmp_path, warm_dirs, installed_python):
    """The build runs in a warm build folder (warm_dirs): the subject is the installed package, its
    files and its command, so the export and C++ compile every `dirs` build test runs are reused,
    and every module of the checkout's pipeline/ is checked to be in the package instead."""
    python = installed_python
    spec_dir = tmp_path / "x"
    shutil.copytree(TINY_SPEC.parent, spec_dir)
    modelwheel = str(python.parent / "modelwheel")
    version = subprocess.run([modelwheel, "--version"], capture_output=True, text=True, cwd="/")
    assert version.stdout.strip() == f"modelwheel {importlib.metadata.version('modelwheel')}", version.stderr
    ran = subprocess.run(
        [modelwheel, "build", "--spec", str(spec_dir / "spec.toml"), *warm_dirs.args(), "-q"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr
    wheel = ran.stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "model_tiny/manifest.json" in names and "model_tiny/_load.py" in names, names
    installed = subprocess.run(
        [str(python), "-c", "import pipeline, sys; print(pipeline.__file__)"], capture_output=True, text=True, cwd="/"
    )
    assert "site-packages" in installed.stdout, "built by the installed package, not a checkout"
    # Every module and data file of the checkout's package is installed, those the reused stages
    # (export, compile) would import too.
    package = Path(installed.stdout.strip()).parent
    own = [p.relative_to(REPO) for p in (REPO / "pipeline").rglob("*.py")]
    checkout = {
        *(str(p) for p in own if not {"__pycache__", "wheel_template"} & set(p.parts)),
        *(f"pipeline/wheel_template/{p.relative_to(REPO / 'templates' / 'wheel')}" for p in templates()),
    }
    missing = sorted(name for name in checkout if not (package.parent / name).is_file())
    assert missing == [], missing


def templates() -> list[Path]:
    """The wheel template's files as pyproject.toml packages them: its modules and its *.in."""
    folder = REPO / "templates" / "wheel"
    found = [*folder.glob("*.in"), *folder.rglob("*.py"), folder / "runtime" / "py.typed"]
    return sorted(p for p in found if "__pycache__" not in p.parts)


def test_verbose_and_quiet_go_before_or_after_the_command(tmp_path):
    missing = str(tmp_path / "none.toml")
    for args in (["-v", "build", "--spec", missing], ["build", "--spec", missing, "--verbose"]):
        ran = run_cli(*args, cwd=tmp_path)
        assert ran.code == 3 and "Traceback" in ran.err and "error: " in ran.err, (args, ran.err)
    quiet = run_cli("matrix", "-q", "--spec", str(TINY_SPEC), cwd=tmp_path)
    assert quiet.code == 0 and json.loads(quiet.out)["include"][0]["model"] == "tiny"


def test_help_and_errors_name_the_modelwheel_command(tmp_path):
    ran = run_cli("--help", cwd=tmp_path)
    assert ran.out.startswith("usage: modelwheel") and "python -m pipeline` is the same command" in ran.out
    ran = run_cli("doctor", cwd=tmp_path)
    assert ran.code == 2 and "e.g. modelwheel doctor --spec" in ran.err


def test_doctor_prints_one_json_record(tmp_path):
    ran = run_cli("doctor", "--spec", str(TINY_SPEC), "--json", cwd=tmp_path)
    assert ran.code == 0, ran.err
    record = json.loads(ran.out)
    assert record["exit_code"] == 0 and record["doctor"]["model"] == "tiny" and record["doctor"]["warnings"] == []


def test_a_package_of_the_users_named_pipeline_is_named_as_the_problem(tmp_path):
    spec_dir = tmp_path / "x"
    shutil.copytree(TINY_SPEC.parent, spec_dir)
    (spec_dir / "pipeline").mkdir()
    (spec_dir / "pipeline" / "__init__.py").write_text("")
    ran = run_cli(
        "build",
        "--spec",
        str(spec_dir),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "d"),
        "--build-dir",
        str(tmp_path / "b"),
        cwd=tmp_path,
    )
    assert ran.code == 4, ran.err
    assert f"{spec_dir / 'pipeline'} is named `pipeline`, which is modelwheel's own import package" in ran.err
    assert "hint: rename your package" in ran.err


def test_the_docs_give_the_command_as_modelwheel():
    """README.md and docs/ write the command a user types as `modelwheel <command>`: never a bare
    `pipeline <command>`, and `python -m pipeline <command>` only where they say what the release
    workflow runs (from the checkout)."""
    command = re.compile(r"(?<![\w./-])(python -m )?pipeline (build|doctor|index|publish|matrix)\b")
    found = [
        (page.name, line.strip())
        for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        for line in page.read_text().splitlines()
        for match in command.finditer(line)
        if not (match.group(1) and "runs `python -m pipeline" in line)
    ]
    assert found == []


def test_the_docs_install_the_tool_with_the_pinned_cpu_torch_from_pytorchs_index():
    """A `pip install .` line as copied installs torch's CPU build, the version requirements.txt
    pins, from PyTorch's CPU index: without the pin, pip pulls PyPI's multi-GB CUDA torch. The rest
    comes at requirements.txt's pins too (`-c requirements.txt`): without them pip took pydantic
    2.14.4, where .venv and the tests run 2.14.3."""
    pin = next(line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("torch=="))
    lines = [
        (page.name, line.strip())
        for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
        for line in page.read_text().splitlines()
        if re.match(r"\s*(pip|pipx) install \.(\s|$)", line)
    ]
    assert lines, "README.md shows how to install the tool"
    for page, line in lines:
        assert line.startswith(f"pip install . {pin}+cpu --extra-index-url https://download.pytorch.org/whl/cpu"), (
            page,
            line,
        )
        assert " -c requirements.txt" in line.split("#")[0], (page, line)


def test_the_build_help_says_it_takes_several_specs_or_a_checkpoint_folder(tmp_path):
    """`modelwheel --help` and `modelwheel build --help` said "one model spec"."""
    for args in (["--help"], ["build", "--help"]):
        ran = run_cli(*args, cwd=tmp_path)
        text = " ".join(ran.out.split()).lower()
        assert (
            ran.code == 0
            and "one or more specs (--spec, repeated: built in parallel), or a transformers or diffusers folder (--hf)"
            in text
        ), ran.out
        assert "one model spec" not in text


def test_a_checkpoint_build_without_its_library_names_the_exact_install(tmp_path, installed_python):
    """A newcomer's modelwheel without transformers got `pip install transformers into the environment
    that runs modelwheel`: which pip, which version? The hint is the one command, with the tested pin."""
    modelwheel = str(installed_python.parent / "modelwheel")
    folder = save_vit(tmp_path / "vit")
    args = ["build", "--hf", str(folder), "--task", "image-classification", "--name", "vit", "--version", "1.0"]
    args += ["--root", str(tmp_path / "opt")]
    ran = subprocess.run(
        [modelwheel, *args, "--dist", str(tmp_path / "dist"), "--build-dir", str(tmp_path / "build")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert ran.returncode == 4, ran.stderr  # ModelLoadError
    assert "a transformers checkpoint, but transformers is not installed here" in ran.stderr, ran.stderr
    assert (
        f"hint: install it into the Python that runs modelwheel: {installed_python} -m pip install "
        f"transformers=={TESTED_LIBRARIES['transformers']} (" in ran.stderr
    ), ran.stderr
    assert "make test-deps" in ran.stderr


def test_the_tested_library_versions_are_requirements_test_txts_pins():
    pins = dict(
        line.split("==", 1) for line in (REPO / "requirements-test.txt").read_text().splitlines() if "==" in line
    )
    assert {name: pins[name] for name in TESTED_LIBRARIES} == TESTED_LIBRARIES
