"""The spec's JSON Schema (`modelwheel schema`), generated from the pydantic models that validate
spec.toml (spec.py, spec_sections.py and each target's [build.<target>] section), so an editor
checks and completes a spec with the keys the build reads (docs/quickstart.md).

The schema is JSON Schema draft-07, not pydantic's 2020-12: Taplo (VS Code's Even Better TOML)
validates with a library that knows draft 4 to 7 only. TOML has no null, so the ``X | None``
of optional keys is written as X alone; the cross-field checks (one of seed and file, the
static dim...) stay with the build, which names the key."""

from __future__ import annotations

from typing import Any

from . import targets
from .spec import Spec

DRAFT = "http://json-schema.org/draft-07/schema#"
# Checkpoint-folder specs (model.hf) take their inputs and outputs from the folder's config.
_MADE_FROM_CHECKPOINT = ("inputs", "outputs")


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec.toml file."""
    raw = Spec.model_json_schema(ref_template="#/definitions/{model}")
    body = _for_toml({key: value for key, value in raw.items() if key != "$defs"})
    definitions = {name: _for_toml(definition) for name, definition in raw.get("$defs", {}).items()}
    # The registry's names, as the build checks them (an installed target's included).
    definitions["BuildSection"]["properties"]["targets"]["items"]["enum"] = targets.names()
    body["required"] = [key for key in body.get("required", []) if key not in _MADE_FROM_CHECKPOINT]
    return {
        "$schema": DRAFT,
        "title": "modelwheel spec.toml",
        "description": "A model's build spec (docs/quickstart.md#the-spec); `modelwheel schema` prints this schema.",
        **body,
        "if": {"properties": {"model": {"required": ["hf"]}}},
        "else": {"required": list(_MADE_FROM_CHECKPOINT)},
        "definitions": definitions,
    }


def _for_toml(node: Any) -> Any:
    """``node`` without what TOML cannot hold or draft-07 would ignore: null alternatives and
    defaults, generated titles ("Search Budget S"), and keys beside a ``$ref``."""
    if isinstance(node, list):
        return [_for_toml(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _for_toml(value) for key, value in node.items() if key not in ("title", "properties")}
    if "properties" in node:  # a mapping of key names, each to its schema
        out["properties"] = {name: _for_toml(value) for name, value in node["properties"].items()}
    if "anyOf" in out:
        kept = [choice for choice in out.pop("anyOf") if choice != {"type": "null"}]
        out = {**kept[0], **out} if len(kept) == 1 else {**out, "anyOf": kept}
    if "default" in out:
        out["default"] = _without_nulls(out["default"])
        if out["default"] is None:
            del out["default"]
    if "$ref" in out and len(out) > 1:  # draft-07 reads nothing beside a $ref: its description would be lost
        out["allOf"] = [{"$ref": out.pop("$ref")}]
    return out


def _without_nulls(value: Any) -> Any:
    """A default as TOML writes it: a section's unset optional keys are left out, not null."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return value
