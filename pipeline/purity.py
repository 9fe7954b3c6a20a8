"""A pure forward: run it twice on the same input; outputs, parameters, buffers and attributes must not change."""

from __future__ import annotations

import copy

import torch

from .errors import PurityError
from .loader import call_forward

_PLAIN = (bool, int, float, str, bytes, type(None), tuple, frozenset)


def _attributes(module: torch.nn.Module) -> dict[str, object]:
    """Every plain attribute of every submodule (not parameters, buffers or submodules), by dotted name."""
    snapshot = {}
    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training":
                continue
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(value, torch.Tensor):
                snapshot[name] = value.detach().clone()
            elif isinstance(value, (list, dict, set)):
                snapshot[name] = copy.deepcopy(value)
            elif isinstance(value, _PLAIN):
                snapshot[name] = value
    return snapshot


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects whose == raises are treated as changed
        return False


def _short(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_purity(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], where: str) -> None:
    state_before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    attrs_before = _attributes(module)
    with torch.no_grad():
        first = call_forward(module, inputs)
        second = call_forward(module, inputs)
    problems = [f"forward changed {kind} '{name}' in place" for name, kind in _changed_state(module, state_before)]
    attrs_after = _attributes(module)
    for name in sorted(set(attrs_before) | set(attrs_after)):
        if name not in attrs_before:
            problems.append(f"forward created self.{name} = {_short(attrs_after[name])}")
        elif name not in attrs_after or not _same(attrs_before[name], attrs_after[name]):
            problems.append(f"forward wrote self.{name} ({_short(attrs_before[name])} -> {_short(attrs_after.get(name))})")
    firsts = first if isinstance(first, (tuple, list)) else (first,)
    seconds = second if isinstance(second, (tuple, list)) else (second,)
    for index, (a, b) in enumerate(zip(firsts, seconds)):
        if isinstance(a, torch.Tensor) and not torch.equal(a, b):
            problems.append(
                f"output {index} differs between two calls on the same input (max diff {float((a - b).abs().max()):.3g}): "
                "forward is random or reads state it changes"
            )
    if problems:
        raise PurityError(
            f"{where}: forward is not pure:\n  " + "\n  ".join(problems),
            "forward must not write to self or draw random numbers: keep state outside the model, pass noise in "
            "as an input (see docs/writing-models.md)",
        )


def _changed_state(module: torch.nn.Module, before: dict[str, torch.Tensor]):
    buffers = {name for name, _ in module.named_buffers()}
    for name, tensor in module.state_dict().items():
        if name in before and not torch.equal(before[name], tensor):
            yield name, "buffer" if name in buffers else "parameter"
