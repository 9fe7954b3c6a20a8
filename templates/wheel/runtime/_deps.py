"""numpy and safetensors, imported where they are used: a missing one is named, with its fix.

Both are the wheel's dependencies, but an install with ``pip install --no-deps`` (or a slimmed
image) can lack them, and ``import model_x`` and ``load()`` need neither.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependency(ImportError):
    """A package this call needs is not installed."""


def require(module: str, package: str, needed_for: str) -> ModuleType:
    """``module`` imported, or MissingDependency naming ``package`` and how to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but broken: its own error says more
        raise MissingDependency(
            f"{needed_for} needs the package {package}, which is not installed here: pip install {package}"
        ) from None
