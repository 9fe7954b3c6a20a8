"""A spec the build cannot honour is refused at spec time, naming the file and key: late
checks (trailing newlines, summaries a wheel cannot carry, version spellings), huge numbers and
impossible job counts."""

from __future__ import annotations

import pytest

from pipeline.errors import SpecError, UsageError
from pipeline.spec import load_spec

from .conftest import GOOD, REPO, TINY_SPEC, BuildDirs, run_cli, spec_copy, spec_error, wheel_manifest

# -- spec checks that came late or never ------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('name = "tiny"', 'name = "tiny\\n"', "model.name"),
        ('factory = "tiny_model:build"', 'factory = "tiny_model:build\\n"', "model.factory"),
    ],
)
def test_trailing_newline_is_refused(tmp_path, old, new, key):
    message = spec_error(tmp_path, old, new)
    assert str(tmp_path / "spec.toml") in message
    assert f"key '{key}'" in message


@pytest.mark.parametrize("description", ["C:\\\\models\\\\tiny", "two\\nlines", "tab\\there", "bell\\u0007"])
def test_description_the_wheel_cannot_carry_is_refused_at_spec_time(tmp_path, description):
    message = spec_error(tmp_path, 'description = "Tiny test model"', f'description = "{description}"')
    assert "key 'model.description'" in message
    assert "one-line summary" in message


def test_description_refusal_through_the_cli(tmp_path):
    spec = spec_copy(tmp_path, GOOD.replace('description = "Tiny test model"', 'description = "a\\\\b"'))
    ran = run_cli(
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
    )
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'model.description'" in ran.err and "hint: " in ran.err
    assert "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize(
    ("written", "normal"),
    [("v0.01", "0.1"), ("1.0.0", "1.0.0"), ("01.2rc1", "1.2rc1"), ("1.3", "1.3"), ("2.0-post1", "2.0.post1")],
)
def test_version_is_normalised_once_in_the_spec_stage(tmp_path, written, normal):
    spec = load_spec(spec_copy(tmp_path, GOOD.replace('version = "0.1"', f'version = "{written}"'))).spec
    assert spec.model.version == normal


def test_invalid_version_names_file_and_key(tmp_path):
    message = spec_error(tmp_path, 'version = "0.1"', 'version = "v0.01-final-final"')
    assert f"{tmp_path / 'spec.toml'}: invalid spec" in message
    assert "key 'model.version'" in message and "PEP 440" in message


@pytest.mark.parametrize(
    ("version", "says"),
    [("banana", "'banana' is not a PEP 440 version"), ("0.1+local", "must not carry a local label")],
)
def test_a_bad_version_flag_is_named_alone(tmp_path, version, says):
    """--version alone: the message and hint used to speak of --weights and a .safetensors file too."""
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--version",
        version,
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
    )
    assert ran.code == SpecError.exit_code, ran.err
    assert f"error: --version: model.version: {says}" in ran.err, ran.err
    assert "hint: give a PEP 440 version without a '+' part (e.g. 1.3)\n" in ran.err and "safetensors" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


def test_shipped_specs_keep_their_version_spelling():
    """Spec hashes feed the cache keys: a version that was already normal is kept as written, so
    the spec dumps (and hashes) exactly as before normalising."""
    import tomllib

    for path in (TINY_SPEC, REPO / "models" / "unet" / "spec.toml", TINY_SPEC.parent / "external.toml"):
        written = tomllib.loads(path.read_text())["model"]["version"]
        assert load_spec(path).spec.model.version == written


@pytest.fixture
def index(tmp_path):
    """A local index on a free port, its state kept in a private working folder."""
    home = tmp_path / "index"
    home.mkdir()
    started = run_cli("index", "start", "--port", "0", "--data", str(home / "data"), cwd=home)
    assert started.code == 0, started.err
    yield home
    assert run_cli("index", "stop", cwd=home).code == 0


def test_non_normal_version_builds_and_publishes_one_spelling(tmp_path, index, warm_dirs):
    """Item 11 and the end of item 10: 'v0.01' is 0.1 in the /opt path, the manifest, the wheel,
    and for publish, which looked for a 'v0.01' wheel and failed with an IndexError. The version
    is not part of what the .so is compiled from: the build reuses the session build's compile
    (warm_dirs) and packages its own wheel."""
    spec = spec_copy(tmp_path / "spec", GOOD.replace('version = "0.1"', 'version = "v0.01"'))
    root, dist = warm_dirs.root, warm_dirs.dist
    dirs = warm_dirs.args()
    ran = run_cli("build", "--spec", str(spec), *dirs)
    assert ran.code == 0, ran.err
    [wheel] = sorted(dist.glob("*.whl"))
    assert wheel.name.startswith("model_tiny-0.1+cpu."), wheel.name
    manifest = wheel_manifest(wheel)
    assert manifest["version"] == "0.1"
    assert manifest["full_version"].startswith("0.1+cpu.")
    assert manifest["opt_path"] == str(root / "tiny" / "0.1" / "cpu")
    assert (dist / f"model_tiny-{manifest['full_version']}.report.json").is_file()

    published = run_cli("publish", "--spec", str(spec), *dirs, cwd=index)
    assert published.code == 0, published.err
    assert "building it" not in published.err  # found the wheel just built
    assert f"{wheel.name}: uploaded to the cpu index" in published.err
    assert sorted(dist.glob("*.whl")) == [wheel]


# -- huge numbers and impossible job counts ----------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ("max = 4", f"max = {2**40}", "dims.batch.max", "less than or equal to 2147483647"),
        ("max = 4", f"max = {2**70}", "dims.batch.max", "less than or equal to 2147483647"),
        ("max = 4", "max = 20000000", "dims.batch.max", "3840000000 elements, over the 2147483648 (2**31)"),
        ('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 16384, 16384]', "dims.batch.max", "at 4, input 'x'"),
        ('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 65536, 65536]', "inputs[0].shape", "elements, over the"),
        ('shape = ["batch", 3, 8, 8]', f'shape = ["batch", 3, {2**40}, 8]', "inputs[0].shape", "elements, over the"),
    ],
)
def test_huge_sizes_are_refused_at_spec_time(tmp_path, old, new, key, says):
    message = spec_error(tmp_path, old, new)
    assert f"key '{key}'" in message, message
    assert says in message, message


def test_huge_dim_max_through_the_cli(tmp_path):
    """It used to compile, then die in verify with a 26-line traceback from the allocator."""
    spec = spec_copy(tmp_path, GOOD.replace("max = 4", f"max = {2**40}"))
    ran = run_cli(
        "build",
        "--spec",
        str(spec),
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
    )
    assert ran.code == SpecError.exit_code, ran.err
    assert "key 'dims.batch.max'" in ran.err and "hint: " in ran.err and "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists()


@pytest.mark.parametrize("jobs", ["-1", "0"])
def test_jobs_below_one_is_a_usage_error(tmp_path, jobs):
    """-j -1 waited forever for a free slot."""
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--spec",
        str(TINY_SPEC.parent / "external.toml"),
        "-j",
        jobs,
        "--root",
        str(tmp_path / "opt"),
        "--dist",
        str(tmp_path / "dist"),
        "--build-dir",
        str(tmp_path / "build"),
        timeout=60,
    )
    assert ran.code == UsageError.exit_code, ran.err
    assert f"error: -j/--jobs {jobs}: the number of parallel builds must be 1 or more" in ran.err
    assert "hint: " in ran.err
    assert not (tmp_path / "build").exists() and not (tmp_path / "dist").exists()


def test_no_search_with_update_lock_is_refused_before_any_work(tmp_path):
    """--no-search turns the option search off, --update-lock runs it again: both at once is a usage error."""
    ran = run_cli(
        "build",
        "--spec",
        str(TINY_SPEC),
        "--no-search",
        "--update-lock",
        *BuildDirs(tmp_path / "opt", tmp_path / "dist", tmp_path / "build").args(),
    )
    assert ran.code == UsageError.exit_code, ran.err
    assert "error: --no-search and --update-lock contradict each other" in ran.err
    assert "hint: give --no-search for one quick compile of the spec's options, or --update-lock to search" in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "opt").exists() and not (tmp_path / "build").exists()


def test_a_mistyped_flag_gets_its_commands_usage_and_the_flag_it_likely_meant():
    """`build --no-serch` got the top-level usage and no suggestion, where spec keys and tasks get one."""
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--no-serch")
    assert ran.code == 2, ran.err
    assert ran.err.startswith("usage: modelwheel build "), ran.err
    assert ran.err.rstrip().endswith(
        "modelwheel build: error: unrecognized arguments: --no-serch (did you mean --no-search?)"
    )
    ran = run_cli("build", "--spec", str(TINY_SPEC), "--zzzz")
    assert ran.err.rstrip().endswith("modelwheel build: error: unrecognized arguments: --zzzz"), ran.err


def test_a_mistyped_command_gets_the_one_it_likely_meant():
    ran = run_cli("biuld", "--spec", str(TINY_SPEC))
    assert ran.code == 2, ran.err
    assert "modelwheel: error: no command 'biuld' (did you mean build?); the commands: build, doctor," in ran.err


def test_a_misspelled_dims_table_is_named(tmp_path):
    """`[dims.bach]` was reported as the shape naming 'batch', not declared, with no word of the table."""
    said = spec_error(tmp_path, "[dims.batch]", "[dims.bach]")
    assert (
        "names dim 'batch', which is not declared under [dims] (is [dims.bach] a misspelling of [dims.batch]?)" in said
    )
