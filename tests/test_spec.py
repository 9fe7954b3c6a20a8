"""Spec validation: every problem names the file and the TOML key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import SpecError
from pipeline.spec import load_spec

from .conftest import TINY_SPEC, run_cli

GOOD = TINY_SPEC.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    return info.value.message


def test_the_shipped_specs_are_valid():
    for path in [TINY_SPEC, Path("models/unet/spec.toml")]:
        spec = load_spec(path).spec
        assert spec.model.version
    unet = load_spec("models/unet").spec
    assert (unet.model.name, unet.model.version, unet.dist_name, unet.import_name) == (
        "unet",
        "1.3",
        "model-unet",
        "model_unet",
    )
    assert unet.dims["batch"].min == 1 and unet.dims["batch"].max >= 2


@pytest.mark.parametrize(
    ("old", "new", "key", "says"),
    [
        ('version = "0.1"', 'version = "one"', "model.version", "PEP 440"),
        ('version = "0.1"', 'version = "0.1+cpu"', "model.version", "local label"),
        ('name = "tiny"', 'name = "Tiny Model"', "model.name", "lowercase"),
        ('factory = "tiny_model:build"', 'factory = "tiny_model"', "model.factory", "package.module:callable"),
        ("seed = 0", "seed = 0\nfile = 'w.safetensors'", "weights", "exactly one"),
        ('shape = ["batch", 3, 8, 8]', 'shape = ["batch", 3, 8, 8]\ndtype = "float8"', "inputs[0].dtype", "float32"),
        (
            'shape = ["batch", 3, 8, 8]',
            'shape = ["batch", 3, 8, 8]\ndtype = "flaot32"',
            "inputs[0].dtype",
            "'flaot32' is not one of 'float32', 'float64', 'float16', 'bfloat16', 'int32' or 'int64'; did you mean "
            "'float32'?",
        ),
        (
            'shape = ["batch", 3, 8, 8]',
            'shape = ["frames", 3, 8, 8]',
            "inputs[0].shape[0]",
            "not declared under [dims]",
        ),
        ("max = 4", "max = 0", "dims.batch.max", "greater than or equal to 1"),
        ("max = 4", "max = 4\nexample = 9", "dims.batch", "outside"),
        ('name = "logits"\nrtol', 'name = "logits"\nrtl', "outputs[1].rtl", "unknown key (did you mean 'rtol'?"),
        ("[dims.batch]", "[dim.batch]", "dim", "unknown key (did you mean 'dims'?"),
        ("max = 4", "maxx = 4\nmax = 4", "dims.batch.maxx", "unknown key (did you mean 'max'?"),
        ("seed = 0", "seed = 0\nzzzz = 1", "weights.zzzz", "unknown key (check its spelling;"),
        ('version = "0.1"', 'version = "0.1"\nlicense = "Apache 2"', "model.license", "not an SPDX license expression"),
        (
            'version = "0.1"',
            'version = "0.1"\nurls = { Home = "ftp://example.com" }',
            "model.urls",
            "not an http(s) URL",
        ),
        ('version = "0.1"', 'version = "0.1"\nurls = { Home = "example.com" }', "model.urls", "not an http(s) URL"),
        (
            'version = "0.1"',
            'version = "0.1"\nurls = { "a, b" = "https://example.com" }',
            "model.urls",
            "without commas",
        ),
    ],
)
def test_bad_spec_names_file_and_key(tmp_path, old, new, key, says):
    assert old in GOOD
    message = spec_error(tmp_path, GOOD.replace(old, new, 1))
    assert str(tmp_path / "spec.toml") in message
    assert f"key '{key}'" in message
    assert says in message


def test_repeated_names_are_refused(tmp_path):
    message = spec_error(tmp_path, GOOD.replace('name = "logits"', 'name = "features"'))
    assert "key 'outputs': names repeat: features" in message


def test_a_misspelt_key_in_a_targets_section_gets_the_key_it_likely_meant(tmp_path):
    message = spec_error(tmp_path, GOOD.replace("search = false", "serach = false") + '\n[build]\ntarget = ["cpu"]\n')
    assert "key 'build.target': unknown key (did you mean 'targets'?" in message
    assert (
        "key 'compile.serach': unknown key (did you mean 'search'? `modelwheel schema` lists the spec keys)" in message
    )
    # where the docs are not (a pip-installed tool), the schema the message names holds the key
    schema = json.loads(run_cli("schema").out)
    assert "search" in schema["definitions"]["CompileSection"]["properties"]
    # a transposition, beside the key it stands for, now missing: difflib alone found 'mxa' too far from 'max'
    message = spec_error(tmp_path, GOOD.replace("max = 4", "mxa = 4"))
    assert "key 'dims.batch.mxa': unknown key (did you mean 'max'?" in message
    assert "key 'dims.batch.max': required, and not given" in message  # not pydantic's "Field required"
    assert message.index("'dims.batch.mxa'") < message.index("'dims.batch.max'"), "the cause first"
    message = spec_error(tmp_path, GOOD + "\n[build.cpu]\nisaa = 'avx2'\n")
    assert "key 'build.cpu.isaa': unknown key (did you mean 'isa'?" in message


def test_a_value_of_the_wrong_kind_is_said_in_tomls_words(tmp_path):
    # pydantic's own read "Input should be a valid number, unable to parse string as a number" (H42)
    text = GOOD.replace("max = 4", "max = 2.5") + '\n[verify]\nlarge_magnitude = "ten"\n\n[build]\ntargets = "cpu"\n'
    message = spec_error(tmp_path, text)
    assert "key 'dims.batch.max': takes a whole number, not 2.5 (a number)" in message
    assert "key 'verify.large_magnitude': takes a number, not \"ten\" (a string)" in message
    assert "key 'build.targets': takes a list, in [ ], not \"cpu\" (a string)" in message
    assert "Input should" not in message


def test_unknown_or_repeated_targets_are_refused(tmp_path):
    message = spec_error(tmp_path, GOOD + '\n[build]\ntargets = ["rocm"]\n')
    assert "key 'build.targets" in message and "unknown target 'rocm': choose from cpu, cuda" in message
    message = spec_error(tmp_path, GOOD + '\n[build]\ntargets = ["cuda", "cuda"]\n')
    assert "key 'build.targets'" in message and "names a target twice" in message


def test_toml_syntax_error_gives_position(tmp_path):
    message = spec_error(tmp_path, GOOD.replace('name = "tiny"', 'name = "tiny'))
    assert "not valid TOML" in message and "line" in message


def test_missing_weights_file_is_named(tmp_path):
    message = spec_error(tmp_path, GOOD.replace("seed = 0", 'file = "nope.safetensors"'))
    assert "key 'weights.file'" in message and "nope.safetensors" in message


def test_cli_reports_spec_error_with_hint_and_exit_code(tmp_path):
    path = write(tmp_path, GOOD.replace('version = "0.1"', 'version = "x.y"'))
    ran = run_cli("build", "--spec", str(path), "--root", str(tmp_path / "root"), "--dist", str(tmp_path / "dist"))
    assert ran.code == SpecError.exit_code
    assert ran.err.startswith("error: ") and "key 'model.version'" in ran.err
    assert "\nhint: " in ran.err
    assert "Traceback" not in ran.err
    assert not (tmp_path / "dist").exists() and not (tmp_path / "root").exists()


def test_cli_missing_spec_file(tmp_path):
    ran = run_cli("build", "--spec", str(tmp_path / "nope.toml"))
    assert ran.code == SpecError.exit_code and "no such spec file" in ran.err
    # a model name that is not one (`make build MODEL=nosuch`): the models there, and make's way to name one
    (tmp_path / "models" / "unet").mkdir(parents=True)
    (tmp_path / "models" / "unet" / "spec.toml").write_text("")
    ran = run_cli("build", "--spec", str(tmp_path / "models" / "nosuch" / "spec.toml"))
    assert ran.code == SpecError.exit_code, ran.err
    assert (
        f"the models in {tmp_path / 'models'}: unet (with make: MODEL=<name>, or SPEC=path/to/spec.toml)" in ran.err
    ), ran.err
    assert "did you mean" not in ran.err, ran.err  # nosuch is near no model's name
    # nor is resnet, though it shares "net" with unet (H63 was asked "did you mean 'unet'?")
    other = run_cli("build", "--spec", str(tmp_path / "models" / "resnet" / "spec.toml"))
    assert "no such spec file" in other.err and "did you mean" not in other.err, other.err
    # a misspelt one: the one meant (H60: `make build MODEL=unte`)
    typo = run_cli("build", "--spec", str(tmp_path / "models" / "unte" / "spec.toml"))
    assert f"error: {tmp_path / 'models' / 'unte' / 'spec.toml'}: no such spec file (did you mean 'unet'?)" in typo.err
    # through make, the hint leads with make's own words (H62: it led with --spec, which make users never type)
    made = run_cli(
        "build",
        "--spec",
        str(tmp_path / "models" / "unte" / "spec.toml"),
        env={"MAKELEVEL": "1", "MODELWHEEL_MAKE_TARGET": "publish"},
    )
    assert f"\nhint: make publish MODEL=unet: the models in {tmp_path / 'models'}: unet (a spec elsewhere: " in made.err
    # a relative path, as a model name outside a checkout makes it, is said as looked for (H61: from /)
    relative = run_cli("build", "--spec", "models/unte/spec.toml", cwd=tmp_path)
    assert (
        f"error: models/unte/spec.toml: no such spec file (looked for {tmp_path / 'models' / 'unte' / 'spec.toml'}) "
        "(did you mean 'unet'?)"
    ) in relative.err, relative.err


@pytest.mark.parametrize("name", ["seed", "device", "not-an-identifier"])
def test_dim_names_that_cannot_be_keywords_are_refused(tmp_path, name):
    spec = tmp_path / "spec.toml"
    spec.write_text(TINY_SPEC.read_text().replace("[dims.batch]", f'[dims."{name}"]').replace('"batch"', f'"{name}"'))
    with pytest.raises(SpecError, match=rf"key 'dims': dim name '{name}' cannot be used: dims are keyword arguments"):
        load_spec(spec)


def test_a_spec_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Windows editors write one: it gave `not valid TOML: Invalid statement (at line 1, column 1)`."""
    path = tmp_path / "spec.toml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert load_spec(path).spec.model.name == "tiny"


def test_weights_that_are_not_a_regular_file_are_named_so(tmp_path):
    (tmp_path / "zero.safetensors").symlink_to("/dev/zero")  # it said "does not exist"
    message = spec_error(tmp_path, GOOD.replace("seed = 0", 'file = "zero.safetensors"'))
    assert "key 'weights.file': /dev/zero is not a regular file" in message


def test_a_summary_longer_than_indexes_accept_is_refused(tmp_path):
    """A 50 MB description made a 105 MB METADATA that twine check --strict passed."""
    message = spec_error(tmp_path, GOOD.replace('description = "Tiny test model"', f'description = "{"x" * 513}"'))
    assert "key 'model.description'" in message and "is 513 characters" in message and "at most 512" in message
    assert load_spec(write(tmp_path, GOOD.replace('description = "Tiny test model"', f'description = "{"x" * 512}"')))
