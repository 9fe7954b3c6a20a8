"""allclose-style comparison with a diff report. Shared, like _inputs.py, by the build and the wheel."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OutputDiff:
    name: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    passed: bool
    problem: str = ""

    def describe(self) -> str:
        text = (
            f"output {self.name!r}: max abs diff {self.max_abs:.3g}, max rel diff {self.max_rel:.3g} "
            f"(rtol {self.rtol:g}, atol {self.atol:g})"
        )
        return text + (f": {self.problem}" if self.problem else "")


def compare(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> OutputDiff:
    """Passes when |got - want| <= atol + rtol * |want| everywhere (NaN must meet NaN).

    The relative diff is taken where |want| > atol: near zero the absolute bound governs.
    """
    if got.shape != want.shape or got.dtype != want.dtype:
        problem = f"got {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
        return OutputDiff(name, float("inf"), float("inf"), rtol, atol, False, problem)
    got64, want64 = got.detach().cpu().to(torch.float64), want.detach().cpu().to(torch.float64)
    if got64.numel() == 0:
        return OutputDiff(name, 0.0, 0.0, rtol, atol, True)
    both_nan = got64.isnan() & want64.isnan()
    nan_mismatch = bool((got64.isnan() != want64.isnan()).any())
    same = (got64 == want64) | both_nan  # equal infinities count as equal, as in torch.allclose
    diff = torch.where(same, torch.zeros_like(got64), (got64 - want64).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    significant = want64.abs() > atol
    max_rel = float((diff[significant] / want64.abs()[significant]).max()) if significant.any() else 0.0
    passed = not nan_mismatch and bool((diff <= atol + rtol * want64.abs().nan_to_num(0.0)).all())
    return OutputDiff(
        name, float(diff.max()), max_rel, rtol, atol, passed, "NaN where the reference has none" if nan_mismatch else ""
    )
