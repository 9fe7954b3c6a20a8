"""A pure forward: run it twice on the same input; outputs, parameters, buffers and attributes must not change.

Attributes are compared by what they hold, not by how Python compares them: tensors and plain
values by value, lists, tuples and dicts item by item, and modules (and other objects) by
identity. A deep copy of a list of modules never equals the list (modules compare by identity),
so comparing copies with `==` called every such list written (issue 30, Mask2Former). A module
kept in a plain list is not registered, so its own state and attributes are walked here too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import PurityError
from .loader import call_forward

CHECK = PurityError.check  # its [doctor] allow key
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_CONTAINERS = (list, tuple, dict)


@dataclass(frozen=True)
class _Ref:
    """An object held by identity: the same object before and after is unchanged."""

    obj: object

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ref) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


@dataclass(frozen=True)
class _Held:
    """A container's snapshot: its kind and its items' snapshots (dict items as key, value pairs)."""

    kind: str
    items: tuple


def _freeze(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return _Held("dict", tuple((key, _freeze(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return _Held(type(value).__name__, tuple(_freeze(item) for item in value))
    if isinstance(value, (set, frozenset)):
        return _Held(type(value).__name__, (frozenset(_Ref(v) if not isinstance(v, _SCALARS) else v for v in value),))
    return value if isinstance(value, _SCALARS) else _Ref(value)


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b))
        )
    if isinstance(a, _Held) or isinstance(b, _Held):
        return (
            isinstance(a, _Held)
            and isinstance(b, _Held)
            and a.kind == b.kind
            and len(a.items) == len(b.items)
            and all(_same(x, y) for x, y in zip(a.items, b.items))
        )
    if isinstance(a, tuple) and isinstance(b, tuple):  # a dict's (key, value) items
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN, kept
    return type(a) is type(b) and bool(a == b)


def _one_line(value: object, width: int = 60) -> str:
    """A value on one line, cut at a word's end: reprs of modules span lines."""
    if isinstance(value, _Ref):
        return f"<{type(value.obj).__name__} object>"
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, _Held):
        return f"{value.kind} of {len(value.items)}"
    text = " ".join(repr(value).split())
    return text if len(text) <= width else text[: width - 2].rsplit(" ", 1)[0] + " …"


def _difference(before: object, after: object) -> str:
    """What changed, down to the first item that differs."""
    if isinstance(before, _Held) and isinstance(after, _Held) and before.kind == after.kind:
        if len(before.items) != len(after.items):
            return f"{before.kind} of {len(before.items)} items -> {len(after.items)} items"
        for index, (x, y) in enumerate(zip(before.items, after.items)):
            if not _same(x, y):
                return f"item [{x[0] if before.kind == 'dict' else index}]: " + _difference(
                    x[1] if before.kind == "dict" else x, y[1] if before.kind == "dict" else y
                )
    if isinstance(before, _Ref) and isinstance(after, _Ref) and type(before.obj) is type(after.obj):
        return f"<{type(before.obj).__name__} object> -> another <{type(after.obj).__name__} object>"
    if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.shape == after.shape:
        diff = (before.double() - after.double()).abs().max() if before.numel() else 0.0
        return f"{_one_line(before)}: values changed (max diff {float(diff):.3g})"
    return f"{_one_line(before)} -> {_one_line(after)}"


def _modules(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every submodule by dotted name, those held in plain lists, tuples and dicts included
    (`decoder.layers[0]`): their state is not in the top module's state_dict."""
    found: dict[str, torch.nn.Module] = {}
    seen: set[int] = set()

    def visit(prefix: str, sub: torch.nn.Module) -> None:
        if id(sub) in seen:
            return
        seen.add(id(sub))
        found[prefix] = sub
        for name, child in sub.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)
        for key, value in vars(sub).items():
            if not key.startswith("_") and isinstance(value, _CONTAINERS):
                items = value.items() if isinstance(value, dict) else enumerate(value)
                for index, item in items:
                    if isinstance(item, torch.nn.Module):
                        visit(f"{prefix}.{key}[{index!r}]" if prefix else f"{key}[{index!r}]", item)

    visit("", module)
    return found


def _snapshot(modules: dict[str, torch.nn.Module]) -> dict[str, tuple[str, str, object]]:
    """name -> (owner's name, what it is, its frozen value) for every parameter, buffer and plain attribute."""
    snapshot: dict[str, tuple[str, str, object]] = {}
    for prefix, sub in modules.items():
        # B023: join is called only within this iteration, so the prefix it sees is this one's
        join = (lambda key: f"{prefix}.{key}") if prefix else (lambda key: key)  # noqa: E731, B023
        for key, tensor in [*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)]:
            kind = "parameter" if isinstance(tensor, torch.nn.Parameter) else "buffer"
            snapshot[join(key)] = (prefix, kind, tensor.detach().clone())
        for key, value in vars(sub).items():
            if key.startswith("_") or key == "training":
                continue
            if isinstance(value, (torch.Tensor, *_CONTAINERS, set, frozenset, *_SCALARS)):
                snapshot[join(key)] = (prefix, "attribute", _freeze(value))
    return snapshot


def _defined_at(cls: type) -> str:
    try:
        return f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]}"
    except (TypeError, OSError):
        return cls.__module__


def _changes(modules: dict[str, torch.nn.Module], before: dict, after: dict) -> list[tuple[str, str]]:
    """(problem, file:line of the class that holds what changed), in name order."""
    found = []
    for name in sorted(set(before) | set(after)):
        owner, kind, old = before.get(name) or after[name]
        if name in before and name in after and _same(old, after[name][2]):
            continue  # unchanged: no need for its class's source line (inspect parses the class's whole file)
        where = _defined_at(type(modules[owner])) if owner in modules else ""
        holder = f" (an attribute of {type(modules[owner]).__name__}, {where})" if owner in modules else ""
        if name not in before:
            found.append((f"forward created self.{name} = {_one_line(after[name][2])}{holder}", where))
        elif name not in after:
            found.append((f"forward deleted self.{name}{holder}", where))
        elif kind == "attribute":
            found.append((f"forward wrote self.{name}: {_difference(old, after[name][2])}{holder}", where))
        else:
            found.append((f"forward changed {kind} '{name}' in place{holder}", where))
    return found


def _output_problems(first: Any, second: Any) -> list[str]:
    """``first`` and ``second``: what two calls of forward returned (a tensor, a tuple or list of them, or anything)."""
    firsts = first if isinstance(first, (tuple, list)) else (first,)
    seconds = second if isinstance(second, (tuple, list)) else (second,)
    return [
        f"output {index} differs between two calls on the same input (max diff {float((a - b).abs().max()):.3g}): "
        "forward is random or reads state it changes"
        for index, (a, b) in enumerate(zip(firsts, seconds))
        if isinstance(a, torch.Tensor) and not torch.equal(a, b)
    ]


def _outside(path: str, folder: Path | None) -> bool:
    if folder is None or not path:
        return False
    try:
        Path(path.rsplit(":", 1)[0]).resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return True
    return False


def check_purity(
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    where: str,
    allow: tuple[str, ...] = (),
    say: Callable[[str], None] = lambda text: None,
    own_folder: Path | None = None,
) -> None:
    """Run forward twice; raise PurityError on any change, or with ``purity`` in ``allow`` say each as a warning."""
    modules = _modules(module)
    before = _snapshot(modules)
    with torch.no_grad():
        first = call_forward(module, inputs)
        second = call_forward(module, inputs)
    changes = _changes(modules, before, _snapshot(modules))
    problems = [text for text, _ in changes] + _output_problems(first, second)
    if not problems:
        return
    if CHECK in allow:
        for problem in problems:
            say(f"{where}: warning [{CHECK}] {problem}")
        return
    in_library = [text for text, at in changes if _outside(at, own_folder)]
    raise PurityError(
        f"{where}: forward is not pure (run twice on the spec's example inputs):\n  " + "\n  ".join(problems),
        (
            f"{len(in_library)} of these are in library code, outside the spec's folder: "
            f'if forward leaves them as they were, add [doctor] allow = ["{CHECK}"] to the spec '
            "(verification still compares the compiled model with eager); otherwise "
            if in_library
            else ""
        )
        + "forward must not write to self or draw random numbers: keep state outside the model, pass noise in "
        "as an input (see docs/writing-models.md)",
    )
