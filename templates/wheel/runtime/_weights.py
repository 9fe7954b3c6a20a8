"""External weights: a safetensors file beside the .so, loaded into the compiled model's constants.

Shared by the build (verification) and the wheel (load, swap). Tensors are memory-mapped from
the file and handed to the runner as user-managed constants, so weights are not copied twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._deps import require

if TYPE_CHECKING:  # the wheel's package imports this module without importing torch
    import torch

# Constants AOTInductor folds from others at run time; they are computed, never supplied.
FOLDED_PREFIX = "_FOLDED_CONST"


class WeightsMismatch(ValueError):
    """A weights file does not fit the compiled model; nothing was loaded."""


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    load_file = require("safetensors.torch", "safetensors", "reading external weights").load_file
    try:
        tensors: dict[str, torch.Tensor] = load_file(str(path))
        return tensors
    except FileNotFoundError:
        raise WeightsMismatch(f"{path}: no such weights file") from None
    except Exception as exc:  # safetensors raises several types for a malformed file
        raise WeightsMismatch(f"{path}: not a readable safetensors file: {exc}") from None


def describe(tensors: Mapping[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    return {
        name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        for name, t in sorted(tensors.items())
    }


def check_weights(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, Mapping[str, Any]], source: str) -> None:
    """Raise WeightsMismatch listing every missing, unexpected or mis-shaped tensor."""
    got = describe(tensors)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = sorted(
        f"{name}: {got[name]['dtype']}{got[name]['shape']}, the model needs {want['dtype']}{list(want['shape'])}"
        for name, want in expected.items()
        if name in got and (got[name]["shape"] != list(want["shape"]) or got[name]["dtype"] != want["dtype"])
    )
    if missing or extra or wrong:
        lines = (
            [f"missing {n}" for n in missing] + [f"unexpected {n}" for n in extra] + [f"mis-shaped {w}" for w in wrong]
        )
        shown = lines[:30] + ([f"... and {len(lines) - 30} more"] if len(lines) > 30 else [])
        raise WeightsMismatch(f"{source} does not fit the model (nothing was loaded):\n  " + "\n  ".join(shown))


def load_into(runner: Any, tensors: Mapping[str, torch.Tensor], *, inactive: bool) -> None:
    """Hand the tensors to the runner's active (or inactive, for a swap) constant buffer."""
    names = runner.get_constant_names_to_original_fqns()
    constants = {name: tensors[fqn] for name, fqn in names.items() if not name.startswith(FOLDED_PREFIX)}
    runner.update_constant_buffer(constants, inactive, True, True)
