"""Replaying captured graphs of the model: one per distinct set of input shapes, bounded, in LRU order.

``GraphRunner`` wraps a ``_direct.DirectRunner`` (the .so's single-threaded entry point, which can
be captured). On the first call with new input shapes it copies the inputs into tensors of its
own, lets the backend warm the model up and capture one call, and from then on each call with
those shapes copies its inputs into them, replays the graph and copies the outputs out. What a
graph is comes from a small interface (``GraphBackend``): the CUDA target's (_target_cuda.py)
captures a ``torch.cuda.CUDAGraph``; a test can pass one that stands in for it on the CPU.

Target-neutral; imports torch only through the tensors it is given.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import torch

    from ._direct import DirectRunner

WARMUPS = 3  # runs before a capture: lazy initialisation (cuBLAS handles, constant folding) stays out of the graph
MAX_GRAPHS = 8  # graphs kept at once: each holds its own inputs, outputs and workspace


class Graph(Protocol):
    def replay(self) -> None:
        """Run the captured call again: reads the captured inputs, writes the captured outputs."""


class GraphBackend(Protocol):
    def capture(self, run: Callable[[], list[torch.Tensor]], warmups: int) -> tuple[Graph, list[torch.Tensor]]:
        """Call ``run`` ``warmups`` times, then capture one call: the graph, and the outputs it writes."""

    # Optional: ``settings() -> Hashable``, the process settings a capture bakes in (TF32 on a
    # GPU): a graph is kept per shapes and settings, so verify() (TF32 off) never replays a
    # graph captured with TF32 on, nor the other way round.


class GraphCaptureWarning(RuntimeWarning):
    """The model could not be captured in a CUDA graph; it runs without graphs."""


class _Captured:
    def __init__(self, graph: Graph, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


def shapes(args: list[torch.Tensor]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(a.shape) for a in args)


Key = tuple[tuple[tuple[int, ...], ...], Any]  # the inputs' shapes, the backend's settings


class GraphRunner:
    """Calls ``direct`` through graphs from ``backend``; quacks like torch's runner for _load.py.

    - ``copy_outputs``: outputs are clones the caller owns (default); False hands back the graph's
      own output tensors, which the next call overwrites.
    - One lock around copy-in, replay and copy-out: calls from several threads run one at a time.
    - A capture that fails is warned about once (``GraphCaptureWarning``, with why); from then on
      every call runs the model directly, without graphs.
    - New weights (``swap_constant_buffer``, or an update of the active constants) drop every
      graph: a graph reads the constants it was captured with."""

    def __init__(
        self,
        direct: DirectRunner,
        backend: GraphBackend,
        name: str,
        *,
        copy_outputs: bool = True,
        max_graphs: int = MAX_GRAPHS,
        warmups: int = WARMUPS,
    ) -> None:
        self._direct, self._backend, self._name = direct, backend, name
        self.copy_outputs, self.max_graphs, self.warmups = copy_outputs, max_graphs, warmups
        self._graphs: OrderedDict[Key, _Captured] = OrderedDict()
        self._lock = threading.Lock()
        self.refused: str | None = None  # why capture failed, once it has
        self.captures = 0

    def run(self, args: list[torch.Tensor]) -> list[torch.Tensor]:
        with self._lock:
            if self.refused is not None:
                return self._direct.run(args)
            key = self._key(args)
            captured = self._graphs.get(key)
            if captured is None:
                captured = self._capture(key, args)
                if captured is None:
                    return self._direct.run(args)
            self._graphs.move_to_end(key)
            for mine, given in zip(captured.inputs, args):
                mine.copy_(given)
            captured.graph.replay()
            return [o.clone() for o in captured.outputs] if self.copy_outputs else list(captured.outputs)

    def capture(self, args: list[torch.Tensor]) -> None:
        """Capture a graph for ``args``' shapes now (load() does for the static sizes)."""
        with self._lock:
            if self.refused is None and self._key(args) not in self._graphs:
                self._capture(self._key(args), args)

    def _key(self, args: list[torch.Tensor]) -> Key:
        settings = getattr(self._backend, "settings", None)
        return shapes(args), settings() if settings else None

    def _capture(self, key: Key, args: list[torch.Tensor]) -> _Captured | None:
        while len(self._graphs) >= self.max_graphs:
            self._graphs.popitem(last=False)  # the least recently used; its memory returns to the pool
        inputs = [a.clone() for a in args]  # outside the graph's pool: nothing captured later can reuse them
        try:
            graph, outputs = self._backend.capture(lambda: self._direct.run(inputs), self.warmups)
        except Exception as exc:  # noqa: BLE001  # any failure: run as without graphs, and say why
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "no message"
            self.refused = f"{type(exc).__name__}: {first}"
            self._graphs.clear()
            warnings.warn(
                f"{self._name}: capturing the model in a CUDA graph failed ({self.refused}); it runs "
                "without CUDA graphs from now on (load(cuda_graphs=False) skips the attempt)",
                GraphCaptureWarning,
                stacklevel=4,
            )
            return None
        self.captures += 1
        self._graphs[key] = captured = _Captured(graph, inputs, outputs)
        return captured

    def drop_graphs(self) -> None:
        with self._lock:
            self._graphs.clear()

    def get_constant_names_to_original_fqns(self) -> dict[str, str]:
        return self._direct.get_constant_names_to_original_fqns()

    def update_constant_buffer(
        self, tensors: dict[str, Any], inactive: bool, validate_full_update: bool, user_managed: bool
    ) -> None:
        with self._lock:
            self._direct.update_constant_buffer(tensors, inactive, validate_full_update, user_managed)
            if not inactive:  # the graphs read the active constants' old memory
                self._graphs.clear()

    def swap_constant_buffer(self) -> None:
        with self._lock:  # no call is between copy-in and copy-out while the weights change
            self._direct.swap_constant_buffer()
            self._graphs.clear()

    def info(self) -> dict[str, Any]:
        """Which path runs, for CompiledModel.info()."""
        if self.refused is not None:
            return {"path": "single-threaded entry point, without CUDA graphs", "refused": self.refused}
        with self._lock:
            held = [[list(shape) for shape in key[0]] for key in self._graphs]
        return {"path": "CUDA graphs", "graphs": held, "max_graphs": self.max_graphs, "copy_outputs": self.copy_outputs}

    def close(self) -> None:
        with self._lock:
            self._graphs.clear()
        self._direct.close()
