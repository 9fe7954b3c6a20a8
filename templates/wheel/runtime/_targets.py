"""The runtime's table of targets: what differs between wheels of different targets when they
load, one module per target (``_target_<name>.py``), as the build has one per target in
pipeline/targets/. A wheel ships its own target's module; its manifest names the target.

Imports neither torch nor numpy: load_numpy() asks it too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, cast

from ._integrity import IntegrityError
from ._schema import Manifest, Platform


class RuntimeTarget(Protocol):
    RELOCATABLE: bool  # whether the .so runs from the installed package as it is
    NUMPY: bool  # whether load_numpy()'s C interface (host memory) can run it

    def device(self, asked: str | None) -> str:
        """The device calls run on (``cpu``, ``cuda:0``); ValueError for one this wheel cannot use."""

    def problems_here(self, m: Manifest, device: str) -> list[str]:
        """Why the model cannot run on ``device`` in this process, each with its fix; [] if it can."""

    def open_runner(self, library: Path, kernel_dir: Path, device: str, num_models: int) -> Any:
        """torch's AOTInductor runner for the .so at ``library`` (its kernel files in ``kernel_dir``)."""

    def reference(self) -> AbstractContextManager[None]:
        """The settings the golden outputs were recorded under."""

    def before_open(self, m: Manifest) -> None:
        """Set the process up for the model once it passed the gate, before it is opened."""

    def where_it_runs(self, m: Manifest) -> str:
        """Which machines the wheel runs on, in words (``info``; the build's summary asks the build's target)."""


class NumpyTarget(RuntimeTarget, Protocol):
    """A target load_numpy() can run (``NUMPY``): its problems read without importing torch."""

    def problems_without_torch(self, m: Manifest) -> list[str]:
        """problems_here's, for the host, with no torch in the process."""


class GraphTarget(RuntimeTarget, Protocol):
    """A target whose calls can replay captured graphs (CUDA): these are optional, and a target
    module without them runs torch's runner only (``graphs_off``)."""

    def stream(self, device: str) -> Callable[[], int | None]:
        """What the .so's single-threaded entry point gets as its stream, read at each call."""

    def graphs_off(self, asked: bool | None) -> str | None:
        """Why calls run without graphs (``asked``: load's cuda_graphs); None: they replay graphs."""

    def graph_backend(self, device: str) -> Any:
        """A _graphs.GraphBackend for ``device``."""


class ConstantsTarget(RuntimeTarget, Protocol):
    """A target whose compiled constants come in layouts of its own besides torch's strided one
    (the CPU's packed weights), which the shared constants store (_constants.py) makes through
    torch's C shim: optional, and a store of a target without them holds strided tensors only."""

    CONSTANT_LAYOUTS: Mapping[str, str]  # the store's name for each layout -> the shim's function for it


def constant_layouts(target: object) -> Mapping[str, str]:
    """The layouts the target's constants may have besides strided (``target``: its runtime module)."""
    return cast(ConstantsTarget, target).CONSTANT_LAYOUTS if hasattr(target, "CONSTANT_LAYOUTS") else {}


def option_notes(name: str) -> Mapping[str, str]:
    """What `info` says beside some of target ``name``'s compile options (its module's optional
    ``OPTION_NOTES``); none where the module is missing, which `info` does not need to describe."""
    try:
        module = importlib.import_module(f"{__package__}.{module_name(name)}") if name.isidentifier() else None
    except ModuleNotFoundError:
        module = None
    notes: Mapping[str, str] = getattr(module, "OPTION_NOTES", {})
    return notes


def platform_type(data: object) -> Any:
    """The type of the platform facts of the wheel whose manifest is ``data``, read before it is
    checked: its target module's ``PLATFORM`` (a Platform with the target's keys), else Platform.
    What stops the lookup (no target, no such module) is for the check and for_manifest to say."""
    name = data.get("target") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name.isidentifier():
        return Platform
    try:
        module = importlib.import_module(f"{__package__}.{module_name(name)}")
    except ModuleNotFoundError:
        return Platform
    return getattr(module, "PLATFORM", Platform)


def graphs_off(target: RuntimeTarget, name: str, asked: bool | None) -> str | None:
    """Why this wheel's calls run without graphs; None where they replay them."""
    if hasattr(target, "graphs_off"):
        return cast(GraphTarget, target).graphs_off(asked)
    if asked:
        raise ValueError(f"cuda_graphs=True: this wheel's target {name!r} has no CUDA graphs")
    return f"target {name!r} has no graphs"


def for_manifest(m: Manifest) -> RuntimeTarget:
    name = m["target"]
    qualified = f"{__package__}.{module_name(name)}"
    try:
        if not name.isidentifier():
            raise ModuleNotFoundError(name=qualified)
        return cast(RuntimeTarget, importlib.import_module(qualified))
    except ModuleNotFoundError as exc:
        if exc.name != qualified:  # a package the target's module needs: that message says which
            raise
        raise IntegrityError(
            f"{m['dist_name']} {m['full_version']} is built for target {name!r}, but its runtime "
            f"module {module_name(name)}.py is missing: the installed package is damaged; reinstall it "
            f"(pip install --force-reinstall {m['dist_name']})"
        ) from None


def variant(m: Mapping[str, Any]) -> str:
    """PyTorch's name for the torch build the wheel pins (``cpu``, ``cu130``): the index it is
    published to, and its torch's. Wheels from before the manifest recorded it: the first part of
    the version's local label."""
    name: str = m.get("variant") or m["full_version"].partition("+")[2].split(".")[0]
    return name


def module_name(target: str) -> str:
    return f"_target_{target}"
