"""Input specs from the manifest: make seeded example inputs and check call arguments.

This file is shared: the build pipeline imports it to make export and verification inputs,
and every wheel carries a copy, so both sides make the same tensors from the same seed.
It imports torch only inside the functions that need it: ``check_sizes`` and ``make_arrays``
serve ``load_numpy()``, which must start without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def resolve_shape(shape: Sequence[int | str], sizes: Mapping[str, int]) -> list[int]:
    return [sizes[axis] if isinstance(axis, str) else int(axis) for axis in shape]


def make_inputs(inputs: Sequence[Mapping[str, Any]], sizes: Mapping[str, int], seed: int) -> list[torch.Tensor]:
    """One tensor per input spec, drawn from a generator seeded with ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in inputs:
        shape = resolve_shape(spec["shape"], sizes)
        dtype = getattr(torch, spec["dtype"])
        low, high = spec.get("low"), spec.get("high")
        if dtype.is_floating_point:
            if low is None:
                values = torch.randn(shape, generator=generator)
            else:
                values = torch.rand(shape, generator=generator) * (high - low) + low
            tensors.append(values.to(dtype))
        else:
            # an integer input always has both ends (the spec requires them)
            tensors.append(torch.randint(int(spec["low"]), int(spec["high"]), shape, generator=generator, dtype=dtype))
    return tensors


def example_sizes(dims: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int]) -> dict[str, int]:
    """Each dynamic dim's size: ``sizes``' where given, else its example size; an unknown dim is refused."""
    unknown = sorted(set(sizes) - set(dims))
    if unknown:
        raise ValueError(f"unknown dims {unknown}; this model's dynamic dims are {sorted(dims)}")
    return {name: dim["example"] for name, dim in dims.items()} | dict(sizes)


def make_arrays(inputs: Sequence[Mapping[str, Any]], sizes: Mapping[str, int], seed: int) -> list[Any]:
    """One numpy array per input spec, from numpy's generator seeded with ``seed``: the shapes,
    dtypes and bounds of ``make_inputs``, made without torch (so other numbers than its tensors)."""
    from ._deps import require

    np = require("numpy", "numpy", "example_arrays() (numpy example inputs)")
    generator = np.random.default_rng(seed)
    arrays = []
    for spec in inputs:
        shape = resolve_shape(spec["shape"], sizes)
        try:
            dtype = np.dtype(spec["dtype"])
        except TypeError:
            raise ValueError(
                f"input {spec['name']!r} is {spec['dtype']}, which numpy has no type for: "
                "use example_inputs() and load()"
            ) from None
        low, high = spec.get("low"), spec.get("high")
        if dtype.kind == "f":
            values = generator.standard_normal(shape) if low is None else generator.uniform(low, high, shape)
            arrays.append(values.astype(dtype))
        else:  # an integer (or bool) input always has both ends (the spec requires them)
            arrays.append(generator.integers(int(spec["low"]), int(spec["high"]), shape).astype(dtype))
    return arrays


def check_inputs(
    inputs: Sequence[Mapping[str, Any]],
    dims: Mapping[str, Mapping[str, Any]],
    args: Sequence[object],
    device: str,
) -> None:
    """Raise ValueError naming the argument when ``args`` do not fit the input specs."""
    import torch

    check_count(inputs, len(args), "tensors")
    shapes: list[tuple[int, ...]] = []
    for spec, arg in zip(inputs, args):
        name = spec["name"]
        if not isinstance(arg, torch.Tensor):
            raise ValueError(f"input {name!r}: expected a torch.Tensor, got {type(arg).__name__}")
        want = torch.device(device)
        if arg.device.type != want.type or (want.index is not None and arg.device.index != want.index):
            raise ValueError(f"input {name!r}: expected a tensor on {device}, got one on {arg.device}")
        if arg.dtype != getattr(torch, spec["dtype"]):
            raise ValueError(
                f"input {name!r}: expected dtype {spec['dtype']}, got {str(arg.dtype).removeprefix('torch.')}"
            )
        shapes.append(tuple(arg.shape))
    check_sizes(inputs, dims, shapes)


def check_count(inputs: Sequence[Mapping[str, Any]], count: int, noun: str) -> None:
    if count != len(inputs):
        names = ", ".join(spec["name"] for spec in inputs)
        raise ValueError(f"expected {len(inputs)} {noun} ({names}), got {count}")


def check_sizes(
    inputs: Sequence[Mapping[str, Any]], dims: Mapping[str, Mapping[str, Any]], shapes: Sequence[Sequence[int]]
) -> None:
    """Raise ValueError naming the argument when a shape has the wrong rank, a wrong fixed size,
    a dynamic size outside its built range, or disagrees with another input on a shared dim."""
    seen: dict[str, tuple[int, str]] = {}
    for spec, shape in zip(inputs, shapes):
        name = spec["name"]
        if len(shape) != len(spec["shape"]):
            scalar = " (a 0-d scalar)" if not shape else ""
            raise ValueError(
                f"input {name!r}: expected {len(spec['shape'])} dims {spec['shape']}, "
                f"got {len(shape)} dims {list(shape)}{scalar}"
            )
        for axis, (want, size) in enumerate(zip(spec["shape"], shape)):
            if isinstance(want, int):
                if size != want:
                    raise ValueError(f"input {name!r}: dim {axis} must be {want}, got {size}")
                continue
            bounds = dims[want]
            if not bounds["min"] <= size <= bounds["max"]:
                raise ValueError(
                    f"input {name!r}: dim {axis} ({want}) is {size}, outside the built range "
                    f"[{bounds['min']}, {bounds['max']}]"
                )
            if want in seen and seen[want][0] != size:
                raise ValueError(
                    f"input {name!r}: dim {axis} ({want}) is {size}, "
                    f"but input {seen[want][1]!r} has {want}={seen[want][0]}"
                )
            seen[want] = (size, name)
