"""Which bound of the allclose rule (|diff| <= atol + rtol * |reference|) let a passed output
through, in words: a relative diff above rtol reads like a failure unless the line says atol
covered it. Shared by the build's summary and the wheel's ``verify`` (a newcomer read
``max rel diff 0.00307 (rtol 0.001, …)`` marked ``ok`` as a failure). Imports nothing: the
summary is printed without torch.
"""

from __future__ import annotations


def decided_by(max_abs: float, max_rel: float, rtol: float, atol: float, reference: str = "eager") -> str:
    if max_abs <= atol:
        # "(rtol 0.001 not needed)" beside a max rel diff of 0.0154 read to a newcomer as a rule broken
        near_zero = f"; the rel diff above rtol {rtol:g} comes from values near 0" if max_rel > rtol else ""
        return f"passed, every diff within atol {atol:g} alone{near_zero}"
    if max_rel <= rtol:
        return f"passed, every relative diff within rtol {rtol:g} (atol {atol:g} where |{reference}| <= atol)"
    return f"passed, every diff within atol + rtol·|{reference}| (atol {atol:g}, rtol {rtol:g}: neither alone)"
