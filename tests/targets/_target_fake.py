"""The runtime side of the tests' fake target (fake.py): shipped in its wheels as
``_target_fake.py``, and the only file the wheel's runtime opens the model through."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

RELOCATABLE = True
NUMPY = False  # load_numpy() refuses it: the tests check that the runtime asks this file
# Its compiles are the cpu target's (fake.py): a static size's shared constants hold its packed weights.
CONSTANT_LAYOUTS = {"mkldnn": "aoti_torch_layout__mkldnn"}
OPENED: list[str] = []  # each library this module opened: the tests read it


def device(asked: str | None) -> str:
    """torch's device for a call: the fake device is reached through the host's."""
    if asked not in (None, "fake"):
        raise ValueError(f"device {asked!r}: this wheel is a FAKE build, for the fake device")
    return "cpu"


def problems_here(m: dict[str, Any], device: str) -> list[str]:
    return ["the fake device refuses the label 'refused'"] if m["fake"]["label"] == "refused" else []


def where_it_runs(m: dict[str, Any]) -> str:
    return f"the fake device, label {m['fake']['label']}"


def before_open(m: dict[str, Any]) -> None:
    pass


def open_runner(library: Path, kernel_dir: Path, device: str, num_models: int) -> Any:
    import torch

    OPENED.append(str(library))
    return torch._C._aoti.AOTIModelContainerRunnerCpu(str(library), num_models)


def reference() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()
