"""The model spec: a TOML file validated by pydantic. A spec error names the file and the key."""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecError, UsageError
from .hf import complete_spec, suggested_name
from .services.frozen import Frozen
from .services.wording import make_command, under_make
from .spec_sections import (
    MAX_INPUT_ELEMENTS,
    NAME_RE,
    TOP_LEVEL_KEY,
    BuildSection,
    CompileSection,
    DimSpec,
    DoctorSection,
    InputSpec,
    ModelSection,
    OutputSpec,
    VerifySection,
    WeightsSection,
)

RESERVED_DIM_NAMES = ("seed", "device")


class Spec(Frozen):
    model: ModelSection
    weights: WeightsSection = WeightsSection()
    dims: dict[str, DimSpec] = {}
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    build: BuildSection = BuildSection()
    compile: CompileSection = CompileSection()
    verify: VerifySection = VerifySection()
    doctor: DoctorSection = DoctorSection()

    @field_validator("dims")
    @classmethod
    def _dim_names(cls, value: dict[str, DimSpec]) -> dict[str, DimSpec]:
        # The wheel's example_inputs(seed, *, device, **sizes) takes dims as keyword arguments.
        for name in value:
            if not name.isidentifier() or name in RESERVED_DIM_NAMES:
                raise ValueError(
                    f"dim name {name!r} cannot be used: dims are keyword arguments of the wheel's "
                    f"example_inputs(), so a name must be a Python identifier other than "
                    f"{' or '.join(repr(n) for n in RESERVED_DIM_NAMES)}"
                )
        return value

    @model_validator(mode="after")
    def _weights_source(self) -> Spec:
        given = self.weights.seed is not None or self.weights.file is not None
        if self.model.hf is None and not given:
            raise ValueError("weights: give exactly one of 'seed' (seeded init) or 'file' (a .safetensors file)")
        if self.model.hf is not None and given:
            raise ValueError(
                "weights: a checkpoint folder's weights come from its safetensors files: remove 'seed' "
                "and 'file' from [weights] (or build with a factory)"
            )
        return self

    @model_validator(mode="after")
    def _names(self) -> Spec:
        for index, spec_input in enumerate(self.inputs):
            for axis, size in enumerate(spec_input.shape):
                if isinstance(size, str) and size not in self.dims:
                    # a misspelled table ([dims.bach]) is the likelier fault than the shape's name
                    near = difflib.get_close_matches(size, list(self.dims), n=1, cutoff=0.6)
                    typo = f" (is [dims.{near[0]}] a misspelling of [dims.{size}]?)" if near else ""
                    raise ValueError(
                        f"inputs[{index}].shape[{axis}]: names dim {size!r}, which is not declared under [dims]{typo}"
                    )
        for label, names in (("inputs", [i.name for i in self.inputs]), ("outputs", [o.name for o in self.outputs])):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"{label}: names repeat: {', '.join(duplicates)}")
        self._check_verify_sizes()
        self._check_static_dim()
        if self.compile.autocast and self.weights.external:
            raise ValueError(
                "compile.autocast: cannot be used with [weights] external = true (the runtime supplies "
                "float32 weights the .so cannot pre-cast); remove one of them"
            )
        if self.compile.freezing and self.weights.external:
            raise ValueError(
                "compile.freezing: cannot be used with [weights] external = true (freezing folds the weights "
                "into the compiled code, so load(weights=...) and swap_weights() could no longer replace "
                "them); remove one of them"
            )
        return self

    @property
    def static_dim(self) -> str | None:
        """The dim with static sizes (the batch dim), or None."""
        return next((name for name, dim in self.dims.items() if dim.static), None)

    def _check_static_dim(self) -> None:
        """Static sizes only on the batch dim: the one every input has as its first axis (the
        runtime picks a compiled size by it, and padding pads and slices along it)."""
        named = [name for name, dim in self.dims.items() if dim.static]
        if len(named) > 1:
            raise ValueError(
                f"dims.{named[1]}.static: only one dim may have static sizes, and dims.{named[0]}.static "
                f"is given; static sizes are for the batch dim"
            )
        if not named:
            return
        for spec_input in self.inputs:
            if not spec_input.shape or spec_input.shape[0] != named[0]:
                raise ValueError(
                    f"dims.{named[0]}.static: static sizes are only for the batch dim, the first axis of every input, "
                    f"but input {spec_input.name!r} has shape {spec_input.shape}"
                )

    def _check_verify_sizes(self) -> None:
        """Each input as verify makes it: at the export sizes, then with each of its dims at its max."""
        export_sizes = {name: dim.export_size for name, dim in self.dims.items()}
        too_big = f"elements, over the {MAX_INPUT_ELEMENTS} (2**31) an input may hold"
        for index, spec_input in enumerate(self.inputs):
            shape = [export_sizes.get(s, 1) if isinstance(s, str) else s for s in spec_input.shape]
            if math.prod(shape) > MAX_INPUT_ELEMENTS:
                raise ValueError(f"inputs[{index}].shape: {shape} is {math.prod(shape)} {too_big}")
            for name in dict.fromkeys(s for s in spec_input.shape if isinstance(s, str) and s in self.dims):
                sizes = {**export_sizes, name: self.dims[name].max}
                shape = [sizes[s] if isinstance(s, str) else s for s in spec_input.shape]
                if math.prod(shape) > MAX_INPUT_ELEMENTS:
                    raise ValueError(
                        f"dims.{name}.max: at {sizes[name]}, input {spec_input.name!r} is {shape}: {math.prod(shape)} "
                        f"{too_big}; the verify stage runs the model at each dim's max, so give a max the build "
                        f"machine can run"
                    )

    @property
    def dist_name(self) -> str:
        return f"model-{self.model.name.replace('_', '-')}"

    @property
    def import_name(self) -> str:
        return f"model_{self.model.name}"


class SpecFile(BaseModel):
    """A validated spec and where it came from (relative paths in it resolve against ``path.parent``)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    path: Path
    spec: Spec

    @property
    def weights_path(self) -> Path | None:
        file = self.spec.weights.file
        return None if file is None else (self.path.parent / file).resolve()


def _not_one_of(value: object, expected: str) -> str:
    """``'flaot32' is not one of 'float32', …; did you mean 'float32'?``"""
    near = difflib.get_close_matches(str(value), re.findall(r"'([^']*)'", expected), n=1, cutoff=0.6)
    return f"{value!r} is not one of {expected}" + (f"; did you mean '{near[0]}'?" if near else "")


def _likely_key(typed: str, beside: list[str], lacking: list[str]) -> str | None:
    """The key ``typed`` likely meant: one with the same letters, of those the spec lacks there first
    (a newcomer's ``mxa`` for a missing ``max``, 0.67 alike by difflib's measure, under its cutoff),
    else the closest of the keys beside it."""
    for key in [*lacking, *beside]:
        if sorted(key) == sorted(typed):
            return key
    near = difflib.get_close_matches(typed, beside, n=1, cutoff=0.75)
    return near[0] if near else None


def _keys_beside(loc: tuple[object, ...]) -> list[str]:
    """The keys the spec takes where ``loc``'s last key stands: those its "did you mean" picks
    from (a newcomer's ``atoll`` and ``serach`` got only "check its spelling")."""
    kinds: list[Any] = [Spec]
    for part in loc[:-1]:
        inner: list[Any] = []
        for kind in kinds:
            if _is_section(kind) and (field := kind.model_fields.get(str(part))):
                inner += _unwrapped(field.annotation)
            elif typing.get_origin(kind) in (list, dict):  # an index or a table's own key (dims.<name>)
                inner += _unwrapped(typing.get_args(kind)[-1])
        kinds = inner
    return sorted({key for kind in kinds if _is_section(kind) for key in kind.model_fields})


def _is_section(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _unwrapped(annotation: Any) -> list[Any]:
    """``X | None`` and ``Annotated[X, …]`` as the X (or Xs) they hold."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrapped(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [kind for arg in typing.get_args(annotation) for kind in _unwrapped(arg)]
    return [annotation]


def _key(loc: tuple[object, ...]) -> str:
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            # A key is echoed back: control and invisible characters as escapes, never raw.
            part = str(part) if str(part).isprintable() else repr(str(part))[1:-1]
            key += f".{part}" if key else part
    return key or "(top level)"


def read_spec_toml(path: str | Path, overrides: bool = False) -> tuple[Path, dict[str, Any]]:
    """The spec file's path (a folder's spec.toml) and its TOML, not yet validated. ``overrides``:
    an --hf build's --spec, a file of the keys that differ from the checkpoint's (H53 was told of
    "a model's spec.toml, or the folder that holds it" for one, with the path as typed)."""
    spec_path = Path(path).resolve()
    if spec_path.is_dir():
        spec_path = spec_path / "spec.toml"
    if overrides and not spec_path.is_file():
        raise SpecError(
            f"{path}: no such override spec ({spec_path} {_not_a_file(spec_path)})",
            "with --hf, --spec takes a TOML file of only the keys that differ from those made from the "
            "checkpoint (docs/library-models.md shows one); check its path",
        )
    if not spec_path.is_file():
        # the models beside it named: `make build MODEL=nosuch` got a hint of --spec, which make users never type
        models = spec_path.parent.parent
        known = sorted(p.parent.name for p in models.glob("*/spec.toml")) if spec_path.name == "spec.toml" else []
        # H54: "--spec PATH" under make means ARGS, which builds beside MODEL's spec: make's own is SPEC=
        beside = (
            f"; the models in {models}: {', '.join(known)} (with make: MODEL=<name>, or SPEC=path/to/spec.toml)"
            if known
            else ""
        )
        # a misspelt name answered with the one meant, as a task's and a key's are (H60: MODEL=unte)
        # above difflib's 0.6: MODEL=resnet got "did you mean 'unet'?" for its shared "net" (H63)
        near = difflib.get_close_matches(spec_path.parent.name, known, n=1, cutoff=0.7) if known else []
        meant = f" (did you mean {near[0]!r}?)" if near else ""
        # a relative path said as looked for: `modelwheel publish unet` from / read "models/unet/spec.toml" (H61)
        looked = f" (looked for {spec_path})" if str(path) != str(spec_path) else ""
        hint = f"pass --spec PATH to a model's spec.toml, or the folder that holds it{beside}"
        if under_make() and known:  # H62: `make build MODEL=unte`'s hint led with --spec, which make users never type
            hint = (
                f"{make_command()} MODEL={near[0] if near else '<name>'}: the models in {models}: "
                f"{', '.join(known)} (a spec elsewhere: SPEC=path/to/spec.toml)"
            )
        raise SpecError(f"{path}: no such spec file{looked}{meant}", hint)
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is read past, not a TOML error
        return spec_path, tomllib.loads(spec_path.read_text(encoding="utf-8-sig"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"{spec_path}: not valid TOML: {exc}", "fix the TOML syntax at the position given") from exc


def load_spec(path: str | Path) -> SpecFile:
    """Read and validate a spec; every problem is a SpecError naming the file and the TOML key."""
    spec_path, raw = read_spec_toml(path)
    model = raw.get("model")
    if isinstance(model, dict) and model.get("hf") is not None:  # a checkpoint folder: the rest from its config
        raw = complete_spec(raw, spec_path.parent, str(spec_path))
    return validated(raw, spec_path)


def validated(raw: dict[str, Any], spec_path: Path, where: str | None = None) -> SpecFile:
    """``raw`` validated as a spec read from ``spec_path`` (``where`` names it in errors)."""
    where = where or str(spec_path)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        # an unknown key before a missing one: 'mxa' is the cause, 'max' missing its consequence
        problems, errors = [], sorted(exc.errors(), key=lambda err: err["type"] == "missing")
        missing = [err["loc"] for err in errors if err["type"] == "missing"]
        for err in errors:
            message = err["msg"].removeprefix("Value error, ")
            loc = err["loc"]
            if not loc and (nested := TOP_LEVEL_KEY.match(message)):
                loc, message = (nested.group(1),), nested.group(2)
            if err["type"] == "literal_error":  # pydantic named neither the value nor the likely one
                message = _not_one_of(err["input"], err.get("ctx", {}).get("expected", ""))
            if err["type"] == "missing":  # pydantic's "Field required", the one capitalised message
                message = "required, and not given"
            message = _wrong_type(err) or message
            if err["type"] == "extra_forbidden":
                lacking = [str(m[-1]) for m in missing if m[:-1] == loc[:-1]]
                near = _likely_key(str(loc[-1]), _keys_beside(loc), lacking)
                spelling = f"did you mean '{near}'?" if near else "check its spelling;"
                message = f"unknown key ({spelling} `modelwheel schema` lists the spec keys)"
            problems.append(f"  key '{_key(loc)}': {message}")
        raise SpecError(
            f"{where}: invalid spec\n" + "\n".join(problems),
            "fix the keys listed above; docs/quickstart.md describes every spec key, and `modelwheel schema` prints "
            "them (where the tool was installed without its docs)",
        ) from exc
    spec_file = SpecFile(path=spec_path, spec=spec)
    weights = spec_file.weights_path
    if weights is not None and not weights.is_file():
        raise SpecError(
            f"{spec_path}: key 'weights.file': {weights} {_not_a_file(weights)}",
            "give the path of a .safetensors file, relative to the spec file",
        )
    return spec_file


# What a key of each kind takes, in TOML's words, by how pydantic's error type begins
_TAKES = {
    "float": "a number",
    "int": "a whole number",
    "bool": "true or false",
    "string": "a string in quotes",
    "list": "a list, in [ ]",
    "dict": "a table",
    "model": "a table",
}
_GIVEN = ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "a string"), (list, "a list"))


def _wrong_type(err: Any) -> str | None:
    """A value of the wrong kind, said as the other key errors are (pydantic's own read "Input should
    be a valid number, unable to parse string as a number", H42), or None for other errors."""
    kind, _, why = err["type"].partition("_")
    if kind not in _TAKES or why not in ("type", "parsing", "from_float"):
        return None
    given = err.get("input")
    said = (
        json.dumps(given)
        if isinstance(given, (str, int, float, bool))
        else "a table"
        if isinstance(given, dict)
        else None
    )
    what = next((name for cls, name in _GIVEN if isinstance(given, cls)), None)
    shown = f"{said} ({what})" if said and what else said or "this value"
    return f"takes {_TAKES[kind]}, not {shown}"


def _not_a_file(path: Path) -> str:
    return "is not a regular file" if path.exists() else "does not exist"


def with_overrides(
    spec_file: SpecFile, *, version: str | None = None, weights: str | None = None, search: bool | None = None
) -> SpecFile:
    """The spec with a new version, weights file and/or search setting (from the command line:
    --version, --weights, --no-search), validated again."""
    raw = spec_file.spec.model_dump(
        exclude_none=True, exclude_unset=True
    )  # keys left out stay left out: a target may default them
    if version is not None:
        raw["model"]["version"] = version
    if weights is not None:
        raw["weights"] = {"file": str(Path(weights).resolve()), "external": spec_file.spec.weights.external}
    if search is not None:
        raw.setdefault("compile", {})["search"] = search
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_key(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        given = [flag for flag, value in (("--version", version), ("--weights", weights)) if value is not None]
        fixes = {"--version": "a PEP 440 version without a '+' part (e.g. 1.3)", "--weights": "a .safetensors file"}
        raise SpecError(
            f"{'/'.join(given)}: {problems}", f"give {' and '.join(fixes[flag] for flag in given)}"
        ) from exc
    overridden = SpecFile(path=spec_file.path, spec=spec)
    if overridden.weights_path is not None and not overridden.weights_path.is_file():
        raise SpecError(
            f"--weights: {weights} {_not_a_file(overridden.weights_path)}", "give the path of a .safetensors file"
        )
    return overridden


def checkpoint_spec(hf: str, task: str, *, name: str | None, version: str | None, spec: str | None) -> SpecFile:
    """The SpecFile for `build --hf DIR --task TASK [--name N] [--version V] [--spec overrides.toml]`."""
    spec_path, raw = read_spec_toml(spec, overrides=True) if spec else (None, {})
    model = raw.setdefault("model", {})
    if not isinstance(model, dict):
        raise SpecError(f"{spec_path}: key 'model': must be a table ([model])", "write [model] as a TOML table")
    if name and not NAME_RE.fullmatch(name):  # said as the flag it came from, not as a spec key
        raise UsageError(
            f"--name {name}: must be lowercase letters, digits and '_', starting with a letter",
            f"e.g. --name {suggested_name(Path(name))}",
        )
    model.update({key: value for key, value in (("name", name), ("version", version)) if value})
    missing = [flag for flag, key in (("--name", "name"), ("--version", "version")) if key not in model]
    if missing:
        raise UsageError(
            f"--hf needs {' and '.join(missing)}: the wheel is model-<name>, version <version>",
            # only the flags missing (H65: "e.g. --name my_vit --version 1.0" beside a --version given)
            "e.g. " + " ".join(f"{flag} {suggested_name(Path(hf)) if flag == '--name' else '1.0'}" for flag in missing),
        )
    model.update(hf=str(Path(hf).resolve()), task=task)
    where = str(spec_path) if spec_path else f"--hf {hf}"
    completed = complete_spec(raw, Path.cwd(), where)
    path = spec_path or Path(completed["model"]["hf"]) / "config.json"
    return validated(completed, path, where)
