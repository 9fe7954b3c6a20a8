"""The spec's sections, one frozen pydantic model each ([model], [weights], [dims.*], [[inputs]],
[[outputs]], [build], [compile], [verify], [doctor]); spec.py puts them together and reads the
file. Per-target sections ([build.<target>], [outputs.<target>]) come from the target registry."""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated, ClassVar, Literal

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from packaging.version import InvalidVersion, Version
from pydantic import ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator

from . import doctor_checks, targets
from .services.frozen import Frozen

DType = Literal["float32", "float64", "float16", "bfloat16", "int32", "int64"]
FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16"}
# Matched with fullmatch: `$` would also accept a trailing newline ("tiny\n").
NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
# Cross-field checks run at the top level; their messages start with the key they concern.
TOP_LEVEL_KEY = re.compile(r"^([\w.\[\]]+): (.*)$", re.S)
FACTORY_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# The description becomes the wheel's one-line Summary, written into a TOML string.
DESCRIPTION_REFUSED = re.compile(r"[\\\x00-\x1f\x7f]")


# Core metadata's Summary: PyPI and warehouse-compatible indexes refuse a longer one.
MAX_SUMMARY = 512


class ModelSection(Frozen):
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
            raise ValueError(
                f"holds {found.group()!r} at position {found.start()}: the description is the wheel's "
                f"one-line summary, so it cannot hold a backslash, a line break or other control characters"
            )
        if len(value) > MAX_SUMMARY:
            raise ValueError(
                f"is {len(value)} characters; the wheel's summary (and its README's first line) may hold "
                f"at most {MAX_SUMMARY}, what package indexes accept: shorten it"
            )
        return value

    @field_validator("license")
    @classmethod
    def _license(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:  # one spelling in the wheel's metadata, as PyPI wants it ("apache-2.0" -> "Apache-2.0")
            return canonicalize_license_expression(value)
        except InvalidLicenseExpression as exc:
            raise ValueError(
                f"{value!r} is not an SPDX license expression ({exc}); e.g. 'Apache-2.0' or "
                "'MIT OR Apache-2.0', identifiers from https://spdx.org/licenses/"
            ) from None

    @field_validator("urls")
    @classmethod
    def _urls(cls, value: dict[str, str]) -> dict[str, str]:
        for label, url in value.items():
            if not label.strip() or DESCRIPTION_REFUSED.search(label) or "," in label:
                raise ValueError(
                    f"label {label!r} must be a non-empty line of text without commas or control "
                    "characters (it is written as 'Project-URL: <label>, <url>')"
                )
            parts = urllib.parse.urlsplit(url)
            if (
                parts.scheme not in ("http", "https")
                or not parts.netloc
                or DESCRIPTION_REFUSED.search(url)
                or " " in url
            ):
                raise ValueError(f"{label!r}: {url!r} is not an http(s) URL (e.g. 'https://example.com/models/unet')")
        return value

    @field_validator("factory")
    @classmethod
    def _factory(cls, value: str | None) -> str | None:
        if value is not None and not FACTORY_RE.fullmatch(value):
            raise ValueError("must look like 'package.module:callable' (e.g. 'models.unet.model:build_unet')")
        return value

    @model_validator(mode="after")
    def _one_model(self) -> ModelSection:
        if (self.factory is None) == (self.hf is None):
            raise ValueError(
                "give exactly one of 'factory' (your code: 'package.module:callable') or 'hf' (a "
                "save_pretrained folder, with 'task')"
            )
        if self.task is not None and self.hf is None:
            raise ValueError("'task' goes with 'hf' (a save_pretrained folder); a factory's spec has no task")
        return self


MAX_SEED = 2**64 - 1  # torch.manual_seed takes no larger one


class WeightsSection(Frozen):
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = Field(
        None, description="seeded init: torch.manual_seed(seed) before the factory runs"
    )
    file: str | None = Field(None, description="a .safetensors file, relative to the spec")
    external: bool = Field(
        False, description="keep weights outside the .so (a safetensors file in the wheel) so they can be swapped"
    )

    @model_validator(mode="after")
    def _one_source(self) -> WeightsSection:
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


class DimSpec(Frozen):
    _LATE_KEYS = ("static", "pad")
    min: Annotated[int, Field(ge=1, le=MAX_DIM)]
    max: Annotated[int, Field(ge=1, le=MAX_DIM)]
    example: int | None = Field(None, description="size used to export; defaults to a middle value")
    static: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(
        [], description="batch sizes also compiled with this dim fixed (each its own .so, one weights file)"
    )
    pad: bool = Field(False, description="run a size between the static ones on the next larger one, padded")

    @model_validator(mode="after")
    def _bounds(self) -> DimSpec:
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
            raise ValueError(
                f"{outside} outside [min, max] = [{low}, {high}]: every static size must be one the "
                f"dynamic model also accepts"
            )
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


# A reason the verification gate accepts (pipeline/stages/signal_check.py): words, not a flag.
Reason = Annotated[str, Field(min_length=1, pattern=r"\S")]


class InputSpec(Frozen):
    _LATE_KEYS = ("allow_unused",)
    name: str
    shape: list[Annotated[int, Field(ge=1)] | str]
    dtype: DType = "float32"
    low: float | None = Field(None, description="uniform values in [low, high) instead of a normal distribution")
    high: float | None = None
    allow_unused: Reason | None = Field(
        None, description="why this input may change no output (the gate then allows it)"
    )

    @model_validator(mode="after")
    def _range(self) -> InputSpec:
        if (self.low is None) != (self.high is None):
            raise ValueError("give both 'low' and 'high', or neither")
        if self.low is not None and self.high is not None and self.high <= self.low:
            raise ValueError(f"'high' ({self.high}) must be greater than 'low' ({self.low})")
        if self.dtype not in FLOAT_DTYPES and self.low is None:
            raise ValueError(f"integer input ({self.dtype}) needs 'low' and 'high'")
        return self


class Tolerance(Frozen):
    rtol: Annotated[float, Field(ge=0)] | None = None
    atol: Annotated[float, Field(ge=0)] | None = None


class _OutputBase(Frozen):
    """``rtol``/``atol`` apply to every target; ``[outputs.<target>]`` (``[outputs.cuda]``)
    overrides them for one (GPU kernels reorder sums differently from CPU ones)."""

    name: str
    rtol: Annotated[float, Field(ge=0)] | None = None
    atol: Annotated[float, Field(ge=0)] | None = None
    allow_constant: Reason | None = Field(
        None, description="why this output may be the same for every input (the gate then allows it)"
    )

    def tolerance_for(self, target: str) -> Tolerance | None:
        return getattr(self, target, None)


class _BuildBase(Frozen):
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
        section: Frozen = getattr(self, target)  # a field per target, made from the registry (create_model)
        return section


# One optional section per registered target, declared by the target (targets/*.py): a new target
# adds its keys without an edit here. Left out of dumps at their defaults, as keys added after
# specs were first hashed are.
OutputSpec = create_model(
    "OutputSpec", __base__=_OutputBase, **{t.NAME: (Tolerance | None, None) for t in targets.all()}
)  # type: ignore[call-overload]
OutputSpec._LATE_KEYS = (*targets.names(), "allow_constant")
BuildSection = create_model(
    "BuildSection", __base__=_BuildBase, **{t.NAME: (t.BUILD_OPTIONS, t.BUILD_OPTIONS()) for t in targets.all()}
)  # type: ignore[call-overload]
BuildSection._LATE_KEYS = tuple(targets.names())


class CompileSection(Frozen):
    _LATE_KEYS = ("search_budget_s", "search_when_noisy")
    # Whether and how long to search: none of them shapes a compiled model (the compile cache's key
    # and the lock's leave them out; a --no-search build recompiled what the search had just cached)
    SEARCH_KEYS: ClassVar[frozenset[str]] = frozenset({"search", "search_budget_s", "search_when_noisy"})
    search: bool = Field(
        True,
        description=(
            "try candidate options; one that verifies replaces the spec's options only if faster beyond measured noise"
        ),
    )
    search_budget_s: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description=(
            "seconds of compiling the search may spend (default: the first compile, and as much again on each core)"
        ),
    )
    search_when_noisy: bool = Field(
        False, description="compile the candidates even where the spec's options time too noisily for one to win"
    )
    freezing: bool = False
    max_autotune: bool = False
    autocast: Literal["bfloat16"] | None = Field(
        None, description="run matmuls and convolutions under this autocast dtype (the tolerances must allow it)"
    )
    inductor: dict[str, bool | int | float | str] = Field(
        {}, description="extra torch._inductor.config options, passed through as-is"
    )


class VerifySection(Frozen):
    edge_cases: bool = Field(True, description="also check all-zero inputs and large magnitudes")
    large_magnitude: Annotated[float, Field(gt=0)] = Field(100.0, description="scale of the large-magnitude case")
    fp64_reference: bool = Field(False, description="compare with eager in float64, reporting eager's own error")
    golden_cases: Annotated[int, Field(ge=1, le=8)] = Field(2, description="cases recorded in the wheel")


class DoctorSection(Frozen):
    allow: list[str] = Field([], description="doctor checks reported as warnings instead of stopping the build")

    @field_validator("allow")
    @classmethod
    def _known_checks(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in doctor_checks.NAMES]
        if unknown:
            raise ValueError(f"unknown check {unknown[0]!r}: choose from {', '.join(doctor_checks.NAMES)}")
        return value
