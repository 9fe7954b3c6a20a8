"""Static batch sizes: which compiled model runs a call, by the size of the batch dim.

A wheel built with ``[dims.<batch>] static = [...]`` carries one .so per static size beside the
dynamic one. A call whose batch is a static size runs on that size's model; with ``pad`` (the
build checked the model is batch-independent) a size between static ones runs on the next larger
one, its inputs padded by repeating their last sample and its outputs sliced back; every other
size runs on the dynamic model. Imports nothing heavy: both loaders use it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._schema import Manifest


def static_library_names(m: Manifest) -> dict[int, str]:
    """Each static size's .so by its path in artifacts/ (its key in the manifest's "artifacts")."""
    return {int(size): record["library"] for size, record in m.get("static", {}).get("sizes", {}).items()}


def static_libraries(m: Manifest, directory: Path) -> dict[int, Path]:
    """Each static size's .so under ``directory`` (empty for a wheel without static sizes)."""
    return {size: directory / name for size, name in static_library_names(m).items()}


def library_names(m: Manifest) -> list[str]:
    """Every .so a loader opens (each checked as it is opened, through its own descriptor)."""
    return [m["library"], *static_library_names(m).values()]


def route(m: Manifest, batch: int) -> tuple[int | None, int]:
    """(the static size that runs a batch of ``batch``, or None for the dynamic model; the size it
    runs at, ``batch`` itself unless padded)."""
    record = m.get("static")
    if not record:
        return None, batch
    return route_among([int(size) for size in record["sizes"]], record["pad"], batch)


def route_among(sizes: list[int], pad: bool, batch: int) -> tuple[int | None, int]:
    """route() for static ``sizes`` and the spec's ``pad`` (the build's gate asks it too)."""
    if batch in sizes:
        return batch, batch
    if pad:
        larger = sorted(size for size in sizes if size > batch)
        if larger:
            return larger[0], larger[0]
    return None, batch


def pad(arrays: list[Any], size: int, concat: Callable[[list[Any]], Any]) -> list[Any]:
    """Each array (torch tensor or numpy array, joined by ``concat``) grown along its first axis to
    ``size`` by repeating its last sample: values the model has seen, so no row of zeros can turn
    into NaN or inf."""
    return [concat([a, *[a[-1:]] * (size - a.shape[0])]) for a in arrays]


def describe(m: Manifest, batch: int) -> str:
    size, runs_at = route(m, batch)
    if size is None:
        return "dynamic"
    return f"static {m['static']['dim']}={size}" + (f" (padded from {batch})" if runs_at != batch else "")
