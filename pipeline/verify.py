"""Stage 3: compare the compiled .so with eager PyTorch on seeded inputs and at every dim bound."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .compile import Compiled
from .errors import VerificationError
from .export import Exported, export_sizes, spec_inputs
from .templates import wheel_inputs

SEEDS = (0, 1, 2)
# allclose-style defaults when the spec gives none: compiled kernels reorder float sums.
DEFAULT_TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
}


@dataclass(frozen=True)
class OutputDiff:
    name: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool
    problem: str = ""


@dataclass(frozen=True)
class CaseResult:
    case: str
    sizes: dict[str, int]
    outputs: tuple[OutputDiff, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


@dataclass(frozen=True)
class Verified:
    cases: tuple[CaseResult, ...]
    tolerances: dict[str, tuple[float, float]]

    def worst(self) -> dict[str, dict[str, float]]:
        """Per output, the largest abs and rel diff over all cases."""
        summary: dict[str, dict[str, float]] = {}
        for case in self.cases:
            for diff in case.outputs:
                entry = summary.setdefault(diff.name, {"max_abs": 0.0, "max_rel": 0.0})
                entry["max_abs"] = max(entry["max_abs"], diff.max_abs)
                entry["max_rel"] = max(entry["max_rel"], diff.max_rel)
        return summary


def tolerances(exported: Exported) -> dict[str, tuple[float, float]]:
    result = {}
    for output, dtype in zip(exported.spec_file.spec.outputs, exported.output_dtypes):
        default_rtol, default_atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
        rtol = default_rtol if output.rtol is None else output.rtol
        atol = default_atol if output.atol is None else output.atol
        result[output.name] = (rtol, atol)
    return result


def verification_cases(exported: Exported) -> list[tuple[str, dict[str, int], int]]:
    """(case name, dim sizes, seed): seeded middles, then each dynamic dim at its min and max."""
    middle = export_sizes(exported.spec_file)
    cases = [(f"seed{seed}", middle, seed) for seed in SEEDS]
    for name, dim in exported.spec_file.spec.dims.items():
        for bound, size in (("min", dim.min), ("max", dim.max)):
            cases.append((f"{name}={bound}({size})", {**middle, name: size}, 100 + len(cases)))
    return cases


def compare(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> OutputDiff:
    if got.shape != want.shape or got.dtype != want.dtype:
        problem = f"compiled {tuple(got.shape)} {got.dtype}, eager {tuple(want.shape)} {want.dtype}"
        return OutputDiff(name, float("inf"), float("inf"), rtol, atol, False, problem)
    got64, want64 = got.double(), want.double()
    diff = (got64 - want64).abs()
    if diff.numel() == 0:
        return OutputDiff(name, 0.0, 0.0, rtol, atol, True)
    nan_mismatch = bool((got64.isnan() != want64.isnan()).any())
    diff = torch.where(got64.isnan() & want64.isnan(), torch.zeros_like(diff), diff)
    max_abs = float(diff.max())
    # Relative error only where |eager| is above atol: near zero, the absolute bound governs.
    significant = want64.abs() > atol
    max_rel = float((diff[significant] / want64.abs()[significant]).max()) if significant.any() else 0.0
    passed = not nan_mismatch and bool((diff <= atol + rtol * want64.abs()).all())
    return OutputDiff(name, max_abs, max_rel, rtol, atol, passed, "NaN where eager has none" if nan_mismatch else "")


def verify_model(exported: Exported, compiled: Compiled) -> Verified:
    runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(compiled.library), 1)
    tols = tolerances(exported)
    names = [o.name for o in exported.spec_file.spec.outputs]
    inputs = spec_inputs(exported.spec_file)
    results = []
    for case, sizes, seed in verification_cases(exported):
        args = wheel_inputs.make_inputs(inputs, sizes, seed)
        with torch.no_grad():
            eager = exported.module(*args)
            got = runner.run(list(args))
        want = eager if exported.returns_tuple else (eager,)
        diffs = tuple(compare(n, g, w, *tols[n]) for n, g, w in zip(names, got, want))
        results.append(CaseResult(case=case, sizes=dict(sizes), outputs=diffs))
    verified = Verified(cases=tuple(results), tolerances=tols)
    failures = [(c, d) for c in results for d in c.outputs if not d.passed]
    if failures:
        lines = [
            f"  case {c.case}: output {d.name!r}: max abs diff {d.max_abs:.3g}, max rel diff {d.max_rel:.3g} "
            f"(rtol {d.rtol:g}, atol {d.atol:g}){' ' + d.problem if d.problem else ''}"
            for c, d in failures
        ]
        spec_path = exported.spec_file.path
        raise VerificationError(
            f"compiled model differs from eager in {len(failures)} of {len(results) * len(names)} checks:\n"
            + "\n".join(lines),
            f"if the forward is deterministic and these diffs are acceptable, raise rtol/atol under [[outputs]] in "
            f"{spec_path}; a random or stateful forward can never verify",
        )
    return verified
