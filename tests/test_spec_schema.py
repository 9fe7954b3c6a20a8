"""The spec's reference comes from its pydantic models: `modelwheel schema` prints a JSON Schema
that every spec in the repository passes and a wrong key fails, and docs/quickstart.md's key
table names exactly the keys the models read, with their defaults."""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any, get_args, get_origin

import jsonschema
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from pipeline.spec import Spec

from .conftest import REPO, TINY_SPEC, run_cli

SPECS = sorted(
    [*REPO.glob("models/*/spec.toml"), *REPO.glob("tests/models/*/spec.toml"), *REPO.glob("tests/zoo/*/spec.toml")]
)
QUICKSTART = REPO / "docs" / "quickstart.md"


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    ran = run_cli("schema")
    assert ran.code == 0, ran.err
    schema = json.loads(ran.out)
    jsonschema.Draft7Validator.check_schema(schema)  # a draft-07 schema, as Taplo reads
    return jsonschema.Draft7Validator(schema)


def problems(validator: jsonschema.Draft7Validator, spec: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}" for e in validator.iter_errors(spec)]


@pytest.mark.parametrize("path", SPECS, ids=[str(p.relative_to(REPO)) for p in SPECS])
def test_every_spec_in_the_repository_passes_the_schema(validator, path):
    assert problems(validator, tomllib.loads(path.read_text())) == []


def test_the_schema_refuses_what_the_build_refuses(validator):
    tiny = tomllib.loads(TINY_SPEC.read_text())
    assert problems(validator, {**tiny, "compile": {"serach": False}})[0].startswith("compile: Additional properties")
    wrong_dtype = {**tiny, "inputs": [{**tiny["inputs"][0], "dtype": "float8"}]}
    assert problems(validator, wrong_dtype)[0].startswith("inputs.0.dtype: 'float8' is not one of")
    assert problems(validator, {**tiny, "build": {"targets": ["tpu"]}})[0].startswith("build.targets.0: 'tpu'")
    assert problems(validator, {key: value for key, value in tiny.items() if key != "outputs"}) == [
        "(top level): 'outputs' is a required property"
    ]


def test_a_checkpoint_folders_spec_needs_no_inputs_or_outputs(validator):
    assert (
        problems(validator, {"model": {"name": "vit", "version": "1.0", "hf": "./vit", "task": "image-classification"}})
        == []
    )


def test_the_printed_schema_can_be_written_to_a_file(tmp_path):
    ran = run_cli("schema", "-o", str(tmp_path / "spec.schema.json"))
    assert ran.code == 0 and ran.out == "", ran.err
    assert json.loads((tmp_path / "spec.schema.json").read_text())["title"] == "modelwheel spec.toml"


def model_keys(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf key of the spec, as the quickstart's table names it: ``dims.<name>.min``,
    ``inputs[].dtype``, ``outputs[].cuda.atol``."""
    found: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        key, annotation = prefix + name, field.annotation
        args = get_args(annotation)
        if get_origin(annotation) is dict and _is_model(args[1]):
            found |= model_keys(args[1], f"{key}.<name>.")
        elif get_origin(annotation) is list and _is_model(args[0]):
            found |= model_keys(args[0], f"{key}[].")
        elif section := next((a for a in (annotation, *args) if _is_model(a)), None):
            found |= model_keys(section, f"{key}.")
        else:
            found[key] = field
    return found


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def table_rows() -> dict[str, str]:
    """docs/quickstart.md's "Every key" table: key -> its default cell."""
    section = QUICKSTART.read_text().split("### Every key", 1)[1].split("\n### ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    return {re.fullmatch(r"\| `([^`]+)`", cells[0]).group(1): cells[2] for cells in rows}  # type: ignore[union-attr]


def test_the_quickstart_key_table_names_every_key_of_the_spec_and_no_other():
    table, keys = table_rows(), model_keys(Spec)
    assert sorted(set(keys) - set(table)) == [], "keys the spec reads that docs/quickstart.md's table leaves out"
    assert sorted(set(table) - set(keys)) == [], "keys in docs/quickstart.md's table that the spec does not read"


def test_the_quickstart_key_table_gives_the_models_defaults():
    keys = model_keys(Spec)
    for key, cell in table_rows().items():
        field = keys[key]
        if cell == "(required)":
            assert field.is_required(), f"{key}: the table says required, the model has a default"
        elif literal := re.fullmatch(r"`([^`]+)`", cell):  # a TOML value: the model's default
            default = field.get_default(call_default_factory=True)
            assert tomllib.loads(f"v = {literal.group(1)}")["v"] == default, (
                f"{key}: the model's default is {default!r}"
            )
        else:
            assert not field.is_required(), f"{key}: the model requires it; the table says {cell!r}"
