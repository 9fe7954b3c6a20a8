"""The model spec: a TOML file validated by pydantic. A spec error names the file and the key."""

from __future__ import annotations

import math
import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator, model_validator

from . import doctor_checks, targets
from .errors import SpecError
from .frozen import Frozen

DType = Literal["float32", "float64", "float16", "bfloat16", "int32", "int64"]
FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16"}
# Matched with fullmatch: `$` would also accept a trailing newline ("tiny\n").
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
# Cross-field checks run at the top level; their messages start with the key they concern.
TOP_LEVEL_KEY = re.compile(r"^([\w.\[\]]+): (.*)$", re.S)
FACTORY_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# The description becomes the wheel's one-line Summary, written into a TOML string.
DESCRIPTION_REFUSED = re.compile(r"[\\\x00-\x1f\x7f]")


_Frozen = Frozen


# Core metadata's Summary: PyPI and warehouse-compatible indexes refuse a longer one.
MAX_SUMMARY = 512


class ModelSection(_Frozen):
    model_config = ConfigDict(allow_inf_nan=True)  # kwargs are the factory's to judge
    _LATE_KEYS = ("license", "urls", "hf", "task")
    name: str = Field(description="Short name: the wheel is model-<name>, the import model_<name>.")
    version: str
    factory: str | None = Field(None, description="importable 'package.module:callable' returning the nn.Module")
    hf: str | None = Field(None, description="a save_pretrained folder to build instead of a factory (pipeline/hf.py)")
    task: str | None = Field(None, description="what to build the hf folder for: image-classification, …")
    kwargs: dict[str, int | float | str | bool | list[int]] = {}
    description: str = ""
    license: str | None = Field(None, description="an SPDX license expression: the wheel's License-Expression")
    urls: dict[str, str] = Field({}, description="label -> http(s) URL: the wheel's Project-URL entries")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.fullmatch(value):
            raise ValueError("must be lowercase letters, digits and '_', starting with a letter (e.g. 'unet')")
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        try:
            parsed = Version(value)
        except InvalidVersion:
            raise ValueError(f"{value!r} is not a PEP 440 version (e.g. '1.3')") from None
        if parsed.local is not None:
            raise ValueError("must not carry a local label ('+...'): the build adds target and torch to it")
        # One spelling for the /opt path, the manifest and the wheel ('v0.01' -> '0.1'); an
        # already-normal version is returned unchanged, so spec hashes (cache keys) stay as they were.
        return str(parsed)

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        if found := DESCRIPTION_REFUSED.search(value):
            raise ValueError(f"holds {found.group()!r} at position {found.start()}: the description is the wheel's "
                             f"one-line summary, so it cannot hold a backslash, a line break or other control characters")
        if len(value) > MAX_SUMMARY:
            raise ValueError(f"is {len(value)} characters; the wheel's summary (and its README's first line) may hold "
                             f"at most {MAX_SUMMARY}, what package indexes accept: shorten it")
        return value

    @field_validator("license")
    @classmethod
    def _license(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:  # one spelling in the wheel's metadata, as PyPI wants it ("apache-2.0" -> "Apache-2.0")
            return canonicalize_license_expression(value)
        except InvalidLicenseExpression as exc:
            raise ValueError(f"{value!r} is not an SPDX license expression ({exc}); e.g. 'Apache-2.0' or "
                             "'MIT OR Apache-2.0', identifiers from https://spdx.org/licenses/") from None

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: dict[str, str]) -> dict[str, str]:
        for label, url in value.items():
            if not label.strip() or DESCRIPTION_REFUSED.search(label) or "," in label:
                raise ValueError(f"label {label!r} must be a non-empty line of text without commas or control "
                                 "characters (it is written as 'Project-URL: <label>, <url>')")
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc or DESCRIPTION_REFUSED.search(url) or " " in url:
                raise ValueError(f"{label!r}: {url!r} is not an http(s) URL (e.g. 'https://example.com/models/unet')")
        return value

    @field_validator("factory")
    @classmethod
    def _factory(cls, value: str | None) -> str | None:
        if value is not None and not FACTORY_RE.fullmatch(value):
            raise ValueError("must look like 'package.module:callable' (e.g. 'models.unet.model:build_unet')")
        return value

    @model_validator(mode="after")
    def _one_model(self) -> "ModelSection":
        if (self.factory is None) == (self.hf is None):
            raise ValueError("give exactly one of 'factory' (your code: 'package.module:callable') or 'hf' (a "
                             "save_pretrained folder, with 'task')")
        if self.task is not None and self.hf is None:
            raise ValueError("'task' goes with 'hf' (a save_pretrained folder); a factory's spec has no task")
        return self


MAX_SEED = 2**64 - 1  # torch.manual_seed takes no larger one


class WeightsSection(_Frozen):
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = Field(
        None, description="seeded init: torch.manual_seed(seed) before the factory runs")
    file: str | None = Field(None, description="a .safetensors file, relative to the spec")
    external: bool = Field(
        False, description="keep weights outside the .so (a safetensors file in the wheel) so they can be swapped"
    )

    @model_validator(mode="after")
    def _one_source(self) -> "WeightsSection":
        # Neither: a checkpoint folder's spec, whose weights come from the folder (Spec checks which).
        if self.seed is not None and self.file is not None:
            raise ValueError("give exactly one of 'seed' (seeded init) or 'file' (a .safetensors file)")
        if self.file is not None and not self.file.endswith(".safetensors"):
            raise ValueError("'file' must be a .safetensors file")
        return self


# The verify stage makes every input with each dim at its max and runs eager and the compiled
# model on it, so an input must be allocatable there; 2**31 elements is also where kernels need
# 64-bit indexing. A dim itself stays within int32, as sizes do in most kernels.
MAX_DIM = 2**31 - 1
MAX_INPUT_ELEMENTS = 2**31


MAX_STATIC_SIZES = 8  # each is a compile of its own, as long as the dynamic model's


class DimSpec(_Frozen):
    _LATE_KEYS = ("static", "pad")
    min: Annotated[int, Field(ge=1, le=MAX_DIM)]
    max: Annotated[int, Field(ge=1, le=MAX_DIM)]
    example: int | None = Field(None, description="size used to export; defaults to a middle value")
    static: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(
        [], description="batch sizes also compiled with this dim fixed (each its own .so, one weights file)")
    pad: bool = Field(False, description="run a size between the static ones on the next larger one, padded")

    @model_validator(mode="after")
    def _bounds(self) -> "DimSpec":
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is smaller than min ({self.min})")
        if self.example is not None and not self.min <= self.example <= self.max:
            raise ValueError(f"example ({self.example}) is outside [min, max] = [{self.min}, {self.max}]")
        return self

    @field_validator("static")
    @classmethod
    def _static(cls, value: list[int], info: ValidationInfo) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"names a size twice: {value}")
        low, high = info.data.get("min"), info.data.get("max")
        outside = [size for size in value if low is not None and high is not None and not low <= size <= high]
        if outside:
            raise ValueError(f"{outside} outside [min, max] = [{low}, {high}]: every static size must be one the "
                             f"dynamic model also accepts")
        if len(value) > MAX_STATIC_SIZES:
            raise ValueError(f"{len(value)} sizes, at most {MAX_STATIC_SIZES} (each is a compile of its own)")
        return sorted(value)

    @field_validator("pad")
    @classmethod
    def _pad(cls, value: bool, info: ValidationInfo) -> bool:
        if value and not info.data.get("static"):
            raise ValueError("needs static sizes to pad to: give 'static = [...]' too, or remove 'pad'")
        return value

    @property
    def export_size(self) -> int:
        """A size inside the range that avoids 0/1 specialisation when the range allows it."""
        if self.example is not None:
            return self.example
        return min(max(self.min, 2), self.max)


class InputSpec(_Frozen):
    name: str
    shape: list[Annotated[int, Field(ge=1)] | str]
    dtype: DType = "float32"
    low: float | None = Field(None, description="uniform values in [low, high) instead of a normal distribution")
    high: float | None = None

    @model_validator(mode="after")
    def _range(self) -> "InputSpec":
        if (self.low is None) != (self.high is None):
            raise ValueError("give both 'low' and 'high', or neither")
        if self.low is not None and self.high is not None and self.high <= self.low:
            raise ValueError(f"'high' ({self.high}) must be greater than 'low' ({self.low})")
        if self.dtype not in FLOAT_DTYPES and self.low is None:
            raise ValueError(f"integer input ({self.dtype}) needs 'low' and 'high'")
        return self


class Tolerance(_Frozen):
    rtol: Annotated[float, Field(ge=0)] | None = None
    atol: Annotated[float, Field(ge=0)] | None = None


class _OutputBase(_Frozen):
    """``rtol``/``atol`` apply to every target; ``[outputs.<target>]`` (``[outputs.cuda]``)
    overrides them for one (GPU kernels reorder sums differently from CPU ones)."""

    name: str
    rtol: Annotated[float, Field(ge=0)] | None = None
    atol: Annotated[float, Field(ge=0)] | None = None

    def tolerance_for(self, target: str) -> Tolerance | None:
        return getattr(self, target, None)


class _BuildBase(_Frozen):
    targets: list[str] = Field(default_factory=lambda: [targets.DEFAULT], min_length=1)

    @field_validator("targets")
    @classmethod
    def _known_once_each(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in targets.names()]
        if unknown:
            raise ValueError(f"unknown target {unknown[0]!r}: choose from {', '.join(targets.names())}")
        if len(set(value)) != len(value):
            raise ValueError(f"names a target twice: {value}")
        return value

    def options(self, target: str) -> Frozen:
        """The target's own ``[build.<target>]`` section (its defaults when the spec has none)."""
        return getattr(self, target)


# One optional section per registered target, declared by the target (targets/*.py): a new target
# adds its keys without an edit here. Left out of dumps at their defaults, as keys added after
# specs were first hashed are.
OutputSpec = create_model("OutputSpec", __base__=_OutputBase,
                          **{t.NAME: (Tolerance | None, None) for t in targets.all()})  # type: ignore[call-overload]
OutputSpec._LATE_KEYS = tuple(targets.names())
BuildSection = create_model("BuildSection", __base__=_BuildBase,
                            **{t.NAME: (t.BUILD_OPTIONS, t.BUILD_OPTIONS()) for t in targets.all()})  # type: ignore[call-overload]
BuildSection._LATE_KEYS = tuple(targets.names())


class CompileSection(_Frozen):
    _LATE_KEYS = ("search_budget_s",)
    search: bool = Field(True, description="try candidate options; one that verifies replaces the spec's options only if faster beyond measured noise")
    search_budget_s: Annotated[float, Field(gt=0)] | None = Field(
        None, description="seconds of compiling the search may spend (default: 3x the first compile, at least 60)")
    freezing: bool = False
    max_autotune: bool = False
    autocast: Literal["bfloat16"] | None = Field(
        None, description="run matmuls and convolutions under this autocast dtype (the tolerances must allow it)"
    )
    inductor: dict[str, bool | int | float | str] = Field(
        {}, description="extra torch._inductor.config options, passed through as-is"
    )


class VerifySection(_Frozen):
    edge_cases: bool = Field(True, description="also check all-zero inputs and large magnitudes")
    large_magnitude: Annotated[float, Field(gt=0)] = Field(100.0, description="scale of the large-magnitude case")
    fp64_reference: bool = Field(False, description="compare with eager in float64, reporting eager's own error")
    golden_cases: Annotated[int, Field(ge=1, le=8)] = Field(2, description="cases recorded in the wheel")


class DoctorSection(_Frozen):
    allow: list[str] = Field([], description="doctor checks reported as warnings instead of stopping the build")

    @field_validator("allow")
    @classmethod
    def _known_checks(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in doctor_checks.NAMES]
        if unknown:
            raise ValueError(f"unknown check {unknown[0]!r}: choose from {', '.join(doctor_checks.NAMES)}")
        return value


RESERVED_DIM_NAMES = ("seed", "device")


class Spec(_Frozen):
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
                raise ValueError(f"dim name {name!r} cannot be used: dims are keyword arguments of the wheel's "
                                 f"example_inputs(), so a name must be a Python identifier other than "
                                 f"{' or '.join(repr(n) for n in RESERVED_DIM_NAMES)}")
        return value

    @model_validator(mode="after")
    def _weights_source(self) -> "Spec":
        given = self.weights.seed is not None or self.weights.file is not None
        if self.model.hf is None and not given:
            raise ValueError("weights: give exactly one of 'seed' (seeded init) or 'file' (a .safetensors file)")
        if self.model.hf is not None and given:
            raise ValueError("weights: a checkpoint folder's weights come from its safetensors files: remove 'seed' "
                             "and 'file' from [weights] (or build with a factory)")
        return self

    @model_validator(mode="after")
    def _names(self) -> "Spec":
        for index, spec_input in enumerate(self.inputs):
            for axis, size in enumerate(spec_input.shape):
                if isinstance(size, str) and size not in self.dims:
                    raise ValueError(
                        f"inputs[{index}].shape[{axis}]: names dim {size!r}, which is not declared under [dims]"
                    )
        for label, names in (("inputs", [i.name for i in self.inputs]), ("outputs", [o.name for o in self.outputs])):
            duplicates = sorted({n for n in names if names.count(n) > 1})
            if duplicates:
                raise ValueError(f"{label}: names repeat: {', '.join(duplicates)}")
        self._check_verify_sizes()
        self._check_static_dim()
        if self.compile.autocast and self.weights.external:
            raise ValueError("compile.autocast: cannot be used with [weights] external = true (the runtime supplies "
                             "float32 weights the .so cannot pre-cast); remove one of them")
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
            raise ValueError(f"dims.{named[1]}.static: only one dim may have static sizes, and dims.{named[0]}.static "
                             f"is given; static sizes are for the batch dim")
        if not named:
            return
        for spec_input in self.inputs:
            if not spec_input.shape or spec_input.shape[0] != named[0]:
                raise ValueError(
                    f"dims.{named[0]}.static: static sizes are only for the batch dim, the first axis of every input, "
                    f"but input {spec_input.name!r} has shape {spec_input.shape}")

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
                        f"machine can run")

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


def read_spec_toml(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The spec file's path (a folder's spec.toml) and its TOML, not yet validated."""
    spec_path = Path(path).resolve()
    if spec_path.is_dir():
        spec_path = spec_path / "spec.toml"
    if not spec_path.is_file():
        raise SpecError(f"{path}: no such spec file", "pass --spec PATH to a model's spec.toml (e.g. models/unet/spec.toml)")
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
        from .hf import complete_spec

        raw = complete_spec(raw, spec_path.parent, str(spec_path))
    return validated(raw, spec_path)


def validated(raw: dict[str, Any], spec_path: Path, where: str | None = None) -> SpecFile:
    """``raw`` validated as a spec read from ``spec_path`` (``where`` names it in errors)."""
    where = where or str(spec_path)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            message = err["msg"].removeprefix("Value error, ")
            loc = err["loc"]
            if not loc and (nested := TOP_LEVEL_KEY.match(message)):
                loc, message = (nested.group(1),), nested.group(2)
            if err["type"] == "extra_forbidden":
                message = "unknown key (check its spelling; see docs/quickstart.md for the spec keys)"
            problems.append(f"  key '{_key(loc)}': {message}")
        raise SpecError(
            f"{where}: invalid spec\n" + "\n".join(problems),
            "fix the keys listed above; docs/quickstart.md describes every spec key",
        ) from exc
    spec_file = SpecFile(path=spec_path, spec=spec)
    weights = spec_file.weights_path
    if weights is not None and not weights.is_file():
        raise SpecError(f"{spec_path}: key 'weights.file': {weights} {_not_a_file(weights)}",
                        "give the path of a .safetensors file, relative to the spec file")
    return spec_file


def _not_a_file(path: Path) -> str:
    return "is not a regular file" if path.exists() else "does not exist"


def with_overrides(spec_file: SpecFile, *, version: str | None = None, weights: str | None = None) -> SpecFile:
    """The spec with a new version and/or weights file (from the command line), validated again."""
    raw = spec_file.spec.model_dump(exclude_none=True)
    if version is not None:
        raw["model"]["version"] = version
    if weights is not None:
        raw["weights"] = {"file": str(Path(weights).resolve()), "external": spec_file.spec.weights.external}
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_key(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise SpecError(f"--version/--weights: {problems}", "give a PEP 440 version and a .safetensors file") from exc
    overridden = SpecFile(path=spec_file.path, spec=spec)
    if overridden.weights_path is not None and not overridden.weights_path.is_file():
        raise SpecError(f"--weights: {weights} {_not_a_file(overridden.weights_path)}",
                        "give the path of a .safetensors file")
    return overridden
