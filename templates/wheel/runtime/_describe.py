"""What a loaded model's call takes and gives, from the manifest: its input names as the call's
signature, ``input_names`` and ``output_names``, and both listed where help(model) shows them.

Outputs stay a plain tuple, not a named tuple: ``torch.save`` of a call's outputs must still load
with ``torch.load``'s default ``weights_only=True``, which refuses any class but its own
(a named tuple, even one pickled as a tuple, fails there).
One wheel holds one model, so the loaders' classes are described once, when they are imported.
Imports nothing heavy: both loaders use it.
"""

from __future__ import annotations

import inspect
from typing import Any

from ._schema import Manifest

_POSITIONAL = inspect.Parameter.POSITIONAL_ONLY


def _identifier(name: str, index: int, prefix: str) -> str:
    # A signature's parameters must be identifiers; the spec's names normally are.
    return name if name.isidentifier() else f"{prefix}{index}"


def _dims(m: Manifest) -> str:
    return "; ".join(f"{name} from {d['min']} to {d['max']}" for name, d in m["dims"].items())


def listing(m: Manifest, kind: str) -> str:
    """The inputs (name, dtype, shape) and outputs (name, dtype), as help() shows them."""
    inputs = "\n".join(f"    {i['name']}: {i['dtype']} {list(i['shape'])}" for i in m["inputs"])
    outputs = "\n".join(f"    {o['name']}: {o['dtype']}" for o in m["outputs"])
    shape = "a tuple, in this order (output_names)" if m["returns_tuple"] else f"one {kind[:-1]}"
    dims = f"\n  dims: {_dims(m)}" if m["dims"] else ""
    return (
        f"{m['dist_name']} {m['full_version']}\n"
        f"  inputs ({kind}, in this order):\n{inputs}{dims}\n"
        f"  returns {shape}:\n{outputs}"
    )


def named(self: Any, outputs: Any) -> dict[str, Any]:
    """A call's outputs by name: ``model.named(model(*inputs))["logits"]``."""
    return dict(zip(self.output_names, outputs if self._manifest["returns_tuple"] else (outputs,)))


def describe(cls: type, m: Manifest, kind: str) -> None:
    """Give ``cls`` the model's ``input_names`` and ``output_names``, ``named()``, its call the
    input names as signature, and the listing in the docstrings of both."""
    given = {
        "named": named,
        "input_names": tuple(i["name"] for i in m["inputs"]),
        "output_names": tuple(o["name"] for o in m["outputs"]),
    }
    for attribute, value in given.items():  # set on the class itself: every instance reads them
        setattr(cls, attribute, value)
    names = [_identifier(i["name"], index, "input") for index, i in enumerate(m["inputs"])]
    call: Any = cls.__call__  # a function of the class, given a signature of the model's inputs
    call.__signature__ = inspect.Signature(
        [inspect.Parameter("self", _POSITIONAL)] + [inspect.Parameter(name, _POSITIONAL) for name in names]
    )
    text = listing(m, kind)
    call.__doc__ = f"{(call.__doc__ or '').strip()}\n\n{text}".strip()
    cls.__doc__ = f"{(cls.__doc__ or '').rstrip()}\n\n    " + text.replace("\n", "\n    ")
