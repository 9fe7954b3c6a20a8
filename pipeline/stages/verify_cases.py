"""What the verify stage compares: its cases (three seeded inputs, each dynamic dim at its min,
middle and max, all-zero and large-magnitude inputs, the golden cases the wheel will carry) and
each output's tolerance, with the spec key (or default) that gave it. verify.py runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..spec import OutputSpec
from ..wheel_template.runtime import _inputs as wheel_inputs
from .export import Exported, export_sizes, spec_inputs

SEEDS = (0, 1, 2)
# allclose-style defaults when the spec gives none: compiled kernels reorder float sums.
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}


@dataclass(frozen=True)
class Case:
    name: str
    sizes: dict[str, int]
    inputs: tuple[torch.Tensor, ...]
    golden: bool = False


@dataclass(frozen=True)
class Tolerance:
    """The tolerance applied to one output, and which spec key (or default) gave each number."""

    rtol: float
    atol: float
    rtol_from: str
    atol_from: str


def applied_tolerances(outputs: list[OutputSpec], dtypes: tuple[str, ...], target: str) -> dict[str, Tolerance]:
    """Per output and number: ``[outputs.<target>]``, else ``[[outputs]]``, else the dtype's default."""
    result = {}
    for index, (output, dtype) in enumerate(zip(outputs, dtypes)):
        defaults = dict(zip(("rtol", "atol"), DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))))
        layers = ((f"outputs[{index}].{target}", output.tolerance_for(target)), (f"outputs[{index}]", output))
        chosen = {}
        for number in ("rtol", "atol"):
            given = [
                (getattr(holder, number), key)
                for key, holder in layers
                if holder is not None and getattr(holder, number) is not None
            ]
            chosen[number] = given[0] if given else (defaults[number], f"default for {dtype}")
        result[output.name] = Tolerance(chosen["rtol"][0], chosen["atol"][0], chosen["rtol"][1], chosen["atol"][1])
    return result


def applied_to(exported: Exported) -> dict[str, Tolerance]:
    return applied_tolerances(exported.spec_file.spec.outputs, exported.output_dtypes, exported.target.NAME)


def tolerances(exported: Exported) -> dict[str, tuple[float, float]]:
    return {name: (t.rtol, t.atol) for name, t in applied_to(exported).items()}


def _edge_inputs(inputs: list[dict], sizes: dict[str, int], kind: str, scale: float) -> tuple[torch.Tensor, ...]:
    """All-zero ('zeros') or large ('large') inputs, kept inside each input's declared value range."""
    tensors = []
    for spec, seeded in zip(inputs, wheel_inputs.make_inputs(inputs, sizes, seed=7)):
        low, high = spec.get("low"), spec.get("high")
        if low is not None and high is not None:  # a declared range (both ends or neither): its two ends
            value = (
                low
                if kind == "zeros"
                else (high - 1 if not seeded.dtype.is_floating_point else high - (high - low) * 1e-3)
            )
            tensors.append(torch.full_like(seeded, value))
        elif kind == "zeros":
            tensors.append(torch.zeros_like(seeded))
        else:
            tensors.append(seeded * scale)
    return tuple(tensors)


def verification_cases(exported: Exported) -> list[Case]:
    """Every case's inputs, on the target's device."""
    spec = exported.spec_file.spec
    inputs = spec_inputs(exported.spec_file)
    middle = export_sizes(exported.spec_file)
    make = lambda sizes, seed: tuple(t.to(exported.device) for t in wheel_inputs.make_inputs(inputs, sizes, seed))  # noqa: E731
    cases = [Case(f"seed{seed}", middle, make(middle, seed)) for seed in SEEDS]
    for name, dim in spec.dims.items():
        bounds = {"min": dim.min, "mid": (dim.min + dim.max) // 2, "max": dim.max}
        for label, size in bounds.items():
            sizes = {**middle, name: size}
            cases.append(Case(f"{name}={label}({size})", sizes, make(sizes, 100 + len(cases))))
    if spec.verify.edge_cases:
        for kind in ("zeros", "large"):
            edge = _edge_inputs(inputs, middle, kind, spec.verify.large_magnitude)
            cases.append(Case(kind, middle, tuple(t.to(exported.device) for t in edge)))
    smallest = {name: dim.min for name, dim in spec.dims.items()}
    for index in range(spec.verify.golden_cases):
        cases.append(Case(f"golden{index}", smallest, make(smallest, 1000 + index), golden=True))
    return cases
