"""What one eager forward really did, for the doctor's source checks.

The source checks read every forward the model holds, library code included. Much of it never
runs for the model as built (code under `if self.training`, branches for options left at their
defaults), and many parameters never hold a tensor (`return_dict`, `use_cache`, `labels=None`):
a branch on them is resolved once at export, like any Python constant. One forward under
sys.settrace records, per forward, the lines that ran and the parameters that held a tensor, so
the checks name only what the trace did.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .loader import call_forward

# sys.settrace's function: called with each event, it returns the function for the frame's next ones
Tracer = Callable[[types.FrameType, str, Any], Any]


@dataclass(frozen=True)
class ForwardRun:
    """One forward's calls during the traced run (empty when it never ran)."""

    lines: frozenset[int] = frozenset()  # line numbers in its file that ran
    tensor_params: frozenset[str] = frozenset()  # parameters that held a tensor in some call

    def ran_any(self, first: int, last: int) -> bool:
        return any(line in self.lines for line in range(first, last + 1))


def _holds_tensor(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):  # *args, or a list of tensors
        return any(isinstance(v, torch.Tensor) for v in value)
    if isinstance(value, dict):  # **kwargs
        return any(isinstance(v, torch.Tensor) for v in value.values())
    return False


def _nested_codes(code: types.CodeType) -> list[types.CodeType]:
    """``code`` and the code of the comprehensions, lambdas and inner functions it defines."""
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _nested_codes(const)
    return found


def _parameter_names(code: types.CodeType) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


def trace_forwards(
    module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], forwards: list[types.FunctionType]
) -> dict[types.CodeType, ForwardRun] | None:
    """Per forward's code object, what one eager run on ``inputs`` did; None when the run raised
    (then nothing is known, and the checks read every line, as before a trace)."""
    owner_of = {nested: f.__code__ for f in forwards for nested in _nested_codes(f.__code__)}
    lines: dict[types.CodeType, set[int]] = defaultdict(set)
    tensors: dict[types.CodeType, set[str]] = defaultdict(set)

    def local_tracer(owner: types.CodeType) -> Tracer:
        def trace_line(frame: types.FrameType, event: str, arg: object) -> Tracer:
            if event == "line":
                lines[owner].add(frame.f_lineno)
            return trace_line

        return trace_line

    def on_call(frame: types.FrameType, event: str, arg: object) -> Tracer | None:
        owner = owner_of.get(frame.f_code)
        if owner is None:
            return None
        if frame.f_code is owner:
            names = _parameter_names(owner)
            tensors[owner].update(n for n in names if _holds_tensor(frame.f_locals.get(n)))
        lines[owner].add(frame.f_lineno)
        return local_tracer(owner)

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        with torch.no_grad():
            call_forward(module, inputs)
    except Exception:  # noqa: BLE001 - the purity and export stages report a forward that raises
        return None
    finally:
        sys.settrace(previous)
    return {
        code: ForwardRun(frozenset(lines[code]), frozenset(tensors[code])) for code in {f.__code__ for f in forwards}
    }
