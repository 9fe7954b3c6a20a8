"""Reduced precision: the model run under bfloat16 autocast, as one compile-search candidate.

Autocast runs matmuls and convolutions in bfloat16 (AMX / AVX512-BF16 where the CPU has them)
and keeps reductions such as norms and softmax in float32; outputs are cast back to the dtypes
eager returns, so the wheel's interface does not change. Whether the result is close enough is
decided by the spec's tolerances: tune.py screens eager-under-autocast against them before
spending a compile, and the compiled candidate then goes through verification like any other.
"""

from __future__ import annotations

import contextlib
import io

import torch

from ..errors import ExportError
from .export import Exported, dynamic_shapes
from .loader import call_forward

# Our own compile option (not an Inductor setting): the candidate's options carry it, so it is
# part of the compile cache key and of the manifest's compile_options.
AUTOCAST_OPTION = "autocast"
AUTOCAST_DTYPE = "bfloat16"


class Autocast(torch.nn.Module):
    """``module`` under autocast to ``dtype``, its floating outputs cast back to ``output_dtypes``."""

    def __init__(
        self,
        module: torch.nn.Module,
        dtype: torch.dtype,
        output_dtypes: tuple[str, ...],
        returns_tuple: bool,
        device_type: str,
    ):
        super().__init__()
        self.module = module
        self.dtype = dtype
        self.device_type = device_type
        self.output_dtypes = tuple(getattr(torch, name) for name in output_dtypes)
        self.returns_tuple = returns_tuple

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        with torch.autocast(self.device_type, dtype=self.dtype):
            outputs = call_forward(self.module, args)
        outputs = tuple(outputs) if self.returns_tuple else (outputs,)
        cast = tuple(out.to(dtype) for out, dtype in zip(outputs, self.output_dtypes))
        return cast if self.returns_tuple else cast[0]


def wrap(exported: Exported, dtype_name: str = AUTOCAST_DTYPE) -> Autocast:
    return Autocast(
        exported.module, getattr(torch, dtype_name), exported.output_dtypes, exported.returns_tuple, exported.device
    ).eval()


def split_options(options: dict[str, object]) -> tuple[str | None, dict[str, object]]:
    """(the autocast dtype or None, the Inductor options without our own key)."""
    inductor = dict(options)
    dtype = inductor.pop(AUTOCAST_OPTION, None)  # a dtype's name: the spec's autocast, or a candidate's
    return (None if dtype is None else str(dtype)), inductor


def export_autocast(exported: Exported, dtype_name: str) -> torch.export.ExportedProgram:
    """torch.export of the wrapped model: the autocast region is recorded in the graph."""
    stderr = io.StringIO()
    try:
        with torch.no_grad(), contextlib.redirect_stderr(stderr):
            # forward(*args): torch.export sees one argument, the tuple of inputs
            return torch.export.export(
                wrap(exported, dtype_name),
                exported.example_inputs,
                dynamic_shapes=(dynamic_shapes(exported.spec_file),),
                strict=False,
            )
    except Exception as exc:  # torch.export raises many types; the fp32 export of this model worked
        raise ExportError(
            f"torch.export under {dtype_name} autocast failed: {type(exc).__name__}: {exc}",
            "remove `autocast` from [compile]; the model exports in float32",
        ) from exc
