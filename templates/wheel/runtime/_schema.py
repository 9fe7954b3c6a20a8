"""The manifest's one definition: what the build writes into manifest.json and the runtime reads.

The build (pipeline/stages/manifest.py) makes a ``Manifest``; the runtime reads one, checked
against these types once, as it is loaded (``problems``). Imports neither torch nor numpy, and
its annotations are evaluated on the runtime's oldest Python (3.9): ``Optional``, not ``X | None``.
A target adds facts of its own under a key of its own (a CUDA wheel's ``cuda``): keys this
definition does not name are kept, unchecked. Its facts about the machine go under ``platform``,
typed by its runtime module (``Platform``).
"""

# ruff: noqa: UP007, UP045  # Optional and Union: these annotations are evaluated, on Python 3.9 too

from typing import Any, Optional, TypedDict, Union, get_args, get_origin, get_type_hints

FORMAT = 1


class Torch(TypedDict):
    version: str  # torch.__version__ (the runtime checks it: it may carry a label the distribution lacks)
    distribution: str  # the distribution's version, which the wheel's requirement pins


class Platform(TypedDict):
    """The machine every wheel records. A target's facts about its machine are keys of their own
    here, in a type that extends this one: its runtime module's ``PLATFORM`` (a CPU wheel's
    instruction set: _target_cpu.py), which the load checks them against (``problems``)."""

    machine: str
    glibc: str


class FileRecord(TypedDict):
    sha256: str
    size: int


class _Input(TypedDict):
    name: str
    shape: list[Union[int, str]]  # sizes, or the names of dims
    dtype: str


class Input(_Input, total=False):
    low: float  # uniform values in [low, high) for the example inputs
    high: float
    allow_unused: str


class Dim(TypedDict):
    min: int
    max: int
    example: int


class Output(TypedDict):
    name: str
    dtype: str
    rtol: float
    atol: float


class TensorRecord(TypedDict):
    shape: list[int]
    dtype: str


class _Weights(TypedDict):
    external: bool
    sha256: str


class Weights(_Weights, total=False):  # external weights only: the file the wheel ships
    file: str
    file_sha256: str
    size: int
    tensors: dict[str, TensorRecord]


class Golden(TypedDict):
    file: str
    sha256: str
    size: int
    cases: list[str]


class _Verification(TypedDict):
    passed: bool
    cases: list[str]


class Verification(_Verification, total=False):
    reference: str


class Candidate(TypedDict):
    name: str
    options: dict[str, Any]
    verified: bool


class NotTried(TypedDict):
    name: str
    reason: str


class CompileSearch(TypedDict):
    chosen: str
    candidates: list[Candidate]
    not_tried: list[NotTried]


# "class" is a keyword: this record is spelled in the functional syntax
Checkpoint = TypedDict("Checkpoint", {"folder": str, "task": str, "library": str, "class": str, "config_sha256": str})


class StaticSize(TypedDict):
    library: str  # its path under artifacts/
    golden_cases: list[str]
    verification: Verification


class Static(TypedDict):
    dim: str
    pad: bool
    sizes: dict[str, StaticSize]  # batch size (as a string: a JSON key) -> its model


class _Manifest(TypedDict):
    format: int
    name: str
    dist_name: str
    import_name: str
    version: str
    full_version: str
    description: Optional[str]
    license: Optional[str]  # an SPDX expression
    urls: dict[str, str]  # label -> URL
    target: str
    device: str
    variant: str  # PyTorch's name for the torch build the wheel pins: its index
    torch: Torch
    platform: Platform
    opt_path: str  # where the build compiled it
    relocatable: bool  # whether the .so runs from wherever it is installed
    library: str
    artifacts: dict[str, FileRecord]  # by path under artifacts/
    inputs: list[Input]
    dims: dict[str, Dim]
    outputs: list[Output]
    returns_tuple: bool
    weights: Weights
    golden: Golden
    verification: Verification
    compile_options: dict[str, Any]
    compile_cache_key: str
    compile_search: CompileSearch
    content_hash: str


class Manifest(_Manifest, total=False):
    checkpoint: Checkpoint  # a build from a save_pretrained folder
    static: Static  # static batch sizes
    constants: dict[str, FileRecord]  # the static sizes' shared constants files
    cuda: dict[str, Any]  # a CUDA wheel's facts (its target's own)


def problems(data: object, platform: Any = Platform) -> list[str]:
    """Each way ``data`` differs from a Manifest ("golden.size: expected int, got str"); [] if none.
    ``platform``: the type its platform facts have, the wheel's target's (a Platform's subtype)."""
    return _check(data, Manifest, "", {"platform": platform})


def _check(value: object, kind: Any, where: str, replaced: Optional[dict[str, Any]] = None) -> list[str]:
    """``replaced``: types that replace the named keys' (of this TypedDict only, not those inside)."""
    if kind is Any:
        return []
    if hasattr(kind, "__required_keys__"):  # a TypedDict
        if not isinstance(value, dict):
            return [f"{where or 'the manifest'}: expected an object, got {type(value).__name__}"]
        prefix = f"{where}." if where else ""
        found = [f"{prefix}{key}: missing" for key in sorted(kind.__required_keys__ - value.keys())]
        hints = {**get_type_hints(kind), **(replaced or {})}
        for key in sorted(value.keys() & hints.keys()):
            found += _check(value[key], hints[key], f"{prefix}{key}")
        return found
    origin, args = get_origin(kind), get_args(kind)
    if origin is Union:
        return (
            []
            if any(not _check(value, arg, where) for arg in args)
            else [f"{where}: expected {' or '.join(_name(arg) for arg in args)}, got {type(value).__name__}"]
        )
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        return [problem for i, item in enumerate(value) for problem in _check(item, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        return [problem for key, item in value.items() for problem in _check(item, args[1], f"{where}.{key}")]
    if _is(value, kind):
        return []
    return [f"{where}: expected {_name(kind)}, got {type(value).__name__}"]


def _is(value: object, kind: Any) -> bool:
    if kind is float:  # JSON writes 1e-3 and 1.0 alike, and an int is a float's value too
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _name(kind: Any) -> str:
    return "null" if kind is type(None) else getattr(kind, "__name__", str(kind))
