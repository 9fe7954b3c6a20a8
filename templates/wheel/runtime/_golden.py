"""Golden cases: inputs and eager outputs recorded at build time, re-run on this machine.

The check that catches a different CPU, GPU or torch build than the one the wheel was verified on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._compare import OutputDiff, compare
from ._deps import require
from ._schema import Manifest


@dataclass(frozen=True)
class GoldenResult:
    case: str
    outputs: tuple[OutputDiff, ...]

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


class GoldenMismatch(AssertionError):
    """The installed model's outputs differ from the recorded eager outputs beyond tolerance."""


def run_golden(
    model: Any, manifest: Manifest, golden_file: Path, device: str, cases: list[str] | None = None
) -> list[GoldenResult]:
    """``cases``: default the dynamic model's (manifest["golden"]["cases"]); a static size's are
    named ``batch<N>/golden<i>``."""
    load_file = require("safetensors.torch", "safetensors", "verify() (reading the golden cases)").load_file
    tensors = load_file(str(golden_file))
    results = []
    for case in manifest["golden"]["cases"] if cases is None else cases:
        args = [tensors[f"{case}/inputs/{spec['name']}"].to(device) for spec in manifest["inputs"]]
        got = model(*args)
        got = got if manifest["returns_tuple"] else (got,)
        diffs = tuple(
            compare(spec["name"], g, tensors[f"{case}/outputs/{spec['name']}"], spec["rtol"], spec["atol"])
            for spec, g in zip(manifest["outputs"], got)
        )
        results.append(GoldenResult(case, diffs))
    return results


def describe_failures(results: list[GoldenResult]) -> str:
    return "\n".join(f"  case {r.case}: {d.describe()}" for r in results for d in r.outputs if not d.passed)
