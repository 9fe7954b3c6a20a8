"""Serving helpers: a fork-safe lazy loader, request checks, and batching of single requests.

Importing this module imports neither torch nor numpy: each array library is imported by the
function that needs it, on first use (numpy arrays from ``load_numpy()``, tensors from ``load()``).

- ``LazyModel`` opens the model on first use in each process. A server that forks workers
  (gunicorn, or uvicorn under gunicorn with ``--preload``) may create it before the fork: the
  model itself is opened in each worker, never shared across a fork (OpenMP's thread pool and
  the model's locks do not survive one).
- ``read_npz`` reads one request's arrays from an .npz body, refusing (``RequestError``, with
  its HTTP status) a body that is no .npz or is over what the model takes, before unpacking it.
- ``check_request`` refuses one request with the runtime's own ``ValueError`` before it joins
  a batch, so a bad request fails alone and the others in its batch still run.
- ``run_batch`` runs many requests in few calls: inputs concatenated along the batch axis, in
  groups of at most the built batch max (first fit), outputs split back per request. It is what a Ray Serve
  ``@serve.batch`` method calls with the list Ray collected. A CUDA wheel replays a CUDA graph per
  batch size (``load()``'s default, docs/cuda.md); outputs the graph keeps (``copy_outputs=False``)
  are copied before a request gets its slice, as the next batch overwrites them.
- ``ModelThreads`` runs an asyncio server's model calls on threads of the model's own, the same
  ones every time (one by default), so the model's OpenMP threads keep up their speed.
- ``DynamicBatcher`` collects concurrent requests in an asyncio server (FastAPI) up to the
  batch max within a wait budget, then calls ``run_batch`` on its ``ModelThreads``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Generic, TypeVar

from ._manifest import manifest

Model = TypeVar("Model", bound=Callable[..., Any])  # a loaded model: called with its inputs
Outputs = Any  # an array or tensor, or a tuple of them when the model returns several
Request = Sequence[Any]  # one call's inputs, by position: arrays or tensors, each with its batch first


class LazyModel(Generic[Model]):
    """``loader()`` run on first use in each process, once, under a lock; calls go to its model.

    Safe to create before a fork: a process that did not load the model itself loads its own."""

    def __init__(self, loader: Callable[[], Model]) -> None:
        self._loader = loader
        self._lock = threading.Lock()
        self._model: Model | None = None
        self._loaded_in: int | None = None  # the pid whose model self._model is

    def get(self) -> Model:
        """This process's model, loaded now if it is not yet."""
        if self._loaded_in != os.getpid():
            with self._lock:
                if self._loaded_in != os.getpid():
                    self._model = self._loader()
                    self._loaded_in = os.getpid()
        return self._model  # type: ignore[return-value]

    @property
    def loaded(self) -> bool:
        """Whether this process has loaded its model."""
        return self._loaded_in == os.getpid()

    def __call__(self, *args: Any) -> Outputs:
        return self.get()(*args)


class ModelThreads:
    """``await threads(*args)`` calls the model on one of ``count`` threads kept for it, never on
    the event loop and never on another thread.

    Why not ``asyncio.to_thread``: every thread that calls the model gets an OpenMP thread pool
    of its own, kept as long as the thread lives, and to_thread spreads calls over up to
    cores + 4 threads. Once those pools hold more threads than there are cores, GNU OpenMP
    stops spinning between the model's parallel regions and puts its threads to sleep instead:
    the unet's batch-1 call took 66 ms from a second thread against 32 ms from one (2 cores,
    2 OpenMP threads each). Keep ``count`` x OpenMP threads <= cores, and load the model with
    ``num_models >= count``. A CUDA wheel replaying CUDA graphs runs one call at a time whatever
    ``count`` is (one lock around each replay; the GPU runs one graph at a time anyway): keep
    ``count`` 1 there. Safe to create before a fork: each process starts its own threads."""

    def __init__(self, model: Callable[..., Outputs], count: int = 1) -> None:
        self.model = model
        self.count = count
        self._executor: ThreadPoolExecutor | None = None
        self._made_in: int | None = None  # the pid whose threads self._executor holds

    async def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on one of the model's threads (``run_batch``, for one)."""
        if self._made_in != os.getpid():
            self._executor = ThreadPoolExecutor(self.count, thread_name_prefix="model")
            self._made_in = os.getpid()
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    async def __call__(self, *args: Any) -> Outputs:
        return await self.run(self.model, *args)


def max_batch() -> int:
    """The largest batch the model was built for (its batch dim's max)."""
    return _batch_range()[1]


# Bytes per element by the manifest's dtype names; a dtype not listed counts as 16, the most any takes.
_ITEM_BYTES = {
    "float64": 8,
    "int64": 8,
    "complex64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
_NPZ_OVERHEAD = 4096  # an .npz file's own bytes beside its arrays: .npy headers and zip records


class RequestError(ValueError):
    """A request body a server refuses, with the HTTP status to answer: 400 (not an .npz file),
    413 (larger than the largest request the model takes), 422 (arrays not named as the inputs)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def max_request_bytes() -> int:
    """The bytes of the largest request body the model takes: an .npz of every input at each
    dim's max. A server reads no further (docs/serving/app.py); ``read_npz`` refuses more."""
    m = manifest()
    total = _NPZ_OVERHEAD
    for spec in m["inputs"]:
        count = 1
        for axis in spec["shape"]:
            count *= m["dims"][axis]["max"] if isinstance(axis, str) else int(axis)
        total += count * _ITEM_BYTES.get(spec["dtype"], 16)
    return total


def read_npz(body: bytes) -> list[Any]:
    """One request's numpy arrays, in the model's input order, from an .npz body (numpy.savez: an
    array per input, named as the model's inputs). Refused with ``RequestError`` before anything
    is unpacked where the body, or what it would unpack to, is over ``max_request_bytes()`` (a
    small compressed file can hold a huge array); pickled objects are never loaded."""
    import io
    import zipfile

    import numpy as np

    names = [spec["name"] for spec in manifest()["inputs"]]
    limit = max_request_bytes()
    if len(body) > limit:
        raise RequestError(413, f"the body is over the {limit} bytes of the largest request the model takes")
    if not body.startswith(b"PK"):  # an .npz file is a zip file
        raise RequestError(
            400, f"the body must be an .npz file (numpy.savez), one array per input named as the model's inputs {names}"
        )
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            unpacked = sum(info.file_size for info in npz.zip.infolist())
            if unpacked > limit:
                raise RequestError(
                    413,
                    f"the arrays unpack to {unpacked} bytes, over the {limit} of the largest request the model takes",
                )
            claimed = _claimed_bytes(npz.zip)
            if claimed > limit:  # numpy would allocate what the header says before reading a byte (8 TB: a 500)
                raise RequestError(
                    413,
                    f"the arrays' headers claim {claimed} bytes, over the {limit} of the largest "
                    "request the model takes",
                )
            arrays = {name: npz[name] for name in npz.files}
    except RequestError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # a damaged .npz, or a member that is no array
        raise RequestError(400, f"the body is not a readable .npz file (numpy.savez): {exc}") from None
    if sorted(arrays) != sorted(names):
        raise RequestError(422, f"expected arrays named {names}, got {sorted(arrays)}")
    return [arrays[name] for name in names]


def _claimed_bytes(archive: Any) -> int:
    """What the .npz's arrays would take in memory, by their .npy headers alone (shape x itemsize)."""
    import math

    from numpy.lib import format as npy

    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    total = 0
    for info in archive.infolist():
        if not info.filename.endswith(".npy"):
            continue
        with archive.open(info) as member:
            version = npy.read_magic(member)
            if version not in readers:
                raise ValueError(f"{info.filename}: .npy format version {version} is not one numpy.savez writes")
            shape, _, dtype = readers[version](member)
        total += math.prod(shape) * dtype.itemsize
    return total


def _batch_range() -> tuple[str, int]:
    m = manifest()
    first_axis = m["inputs"][0]["shape"][0]
    if not isinstance(first_axis, str):
        raise ValueError(
            f"{m['dist_name']} has a fixed first axis ({first_axis}): it has no batch dim to batch requests along"
        )
    return first_axis, m["dims"][first_axis]["max"]


def check_request(args: Request) -> None:
    """Raise the runtime's ValueError, naming the input, when ``args`` would not run as one call:
    count, dtype, shapes, a batch outside the built range. numpy arrays are checked as
    ``load_numpy()`` checks them, tensors as ``load()`` does (all on one device: a request is
    checked before it is moved to the model's)."""
    from ._inputs import check_count, check_inputs, check_sizes

    m = manifest()
    if args and type(args[0]).__module__.startswith("torch"):
        check_inputs(m["inputs"], m["dims"], args, str(args[0].device))
        return
    from ._native import _check_array

    check_count(m["inputs"], len(args), "arrays")
    for spec, arg in zip(m["inputs"], args):
        _check_array(spec, arg)
    check_sizes(m["inputs"], m["dims"], [a.shape for a in args])


def _concat(parts: Sequence[Any]) -> Any:
    if type(parts[0]).__module__.startswith("torch"):
        import torch

        return torch.cat(list(parts))
    import numpy as np

    return np.concatenate(parts)


def _groups(requests: Sequence[Request], limit: int) -> list[list[int]]:
    """Request indexes grouped so each group's batches add up to at most ``limit``: each request
    joins the first group with room for it (first fit: sizes 3, 3, 1, 1 under 4 make two calls,
    not the three that filling groups in turn makes), in arrival order within a group."""
    groups: list[list[int]] = []
    filled: list[int] = []
    for index, request in enumerate(requests):
        size = len(request[0])
        room = next((g for g, used in enumerate(filled) if used + size <= limit), None)
        if room is None:
            groups.append([])
            filled.append(0)
            room = len(groups) - 1
        groups[room].append(index)
        filled[room] += size
    return groups


def _owns_outputs(model: Callable[..., Outputs]) -> bool:
    """Whether the caller owns what ``model`` returns: not a CUDA wheel loaded with
    ``copy_outputs=False``, whose outputs are its graph's own tensors, overwritten by the next call."""
    inner = model.get() if isinstance(model, LazyModel) else model
    return bool(getattr(inner, "copy_outputs", True))


def _copying(model: Callable[..., Outputs]) -> Callable[..., Outputs]:
    """``model``, its outputs copied out of the graph's tensors before the next batch runs: a
    request's slice is read after the call that made it has returned."""

    def call(*args: Any) -> Outputs:
        outputs = model(*args)
        return tuple(o.clone() for o in outputs) if isinstance(outputs, tuple) else outputs.clone()

    return call


def run_batch(model: Callable[..., Outputs], requests: Sequence[Request], limit: int | None = None) -> list[Outputs]:
    """Each request's outputs, computed in few calls of ``model``: each request joins the first
    call with room for it under the batch max (first fit).

    Every request must already pass ``check_request`` (so none exceeds the batch max). Requests
    are never split across calls; ``limit`` (default: the built batch max) caps a call's batch."""
    limit = limit or max_batch()
    results: list[Outputs] = [None] * len(requests)
    call = model if _owns_outputs(model) else _copying(model)
    for group in _groups(requests, limit):
        members = [requests[i] for i in group]
        if len(members) == 1:
            results[group[0]] = call(*members[0])
            continue
        stacked = [_concat([request[k] for request in members]) for k in range(len(members[0]))]
        outputs = call(*stacked)
        several = isinstance(outputs, tuple)
        start = 0
        for index, request in zip(group, members):
            end = start + len(request[0])
            results[index] = tuple(o[start:end] for o in outputs) if several else outputs[start:end]
            start = end
    return results


class DynamicBatcher:
    """Await ``batcher(*inputs)`` from concurrent requests: they run together, as one call of the
    model per group of at most ``limit`` samples, after waiting at most ``max_wait_s`` for more.

    Bad requests raise the runtime's ValueError at once and never join a batch. The model runs
    on ``threads`` (a ``ModelThreads`` of one thread unless given; pass the server's own to share
    it), one batch at a time, so the event loop keeps accepting requests meanwhile."""

    def __init__(
        self,
        model: Callable[..., Outputs],
        max_wait_s: float = 0.005,
        limit: int | None = None,
        threads: ModelThreads | None = None,
    ) -> None:
        self.model = model
        self.max_wait_s = max_wait_s
        self.limit = limit or max_batch()
        self.threads = threads or ModelThreads(model)
        # Waiting requests in arrival order; a list and an event rather than a queue, so a wait
        # that times out can never lose a request.
        self._pending: list[tuple[Request, asyncio.Future[Outputs]]] = []
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    async def __call__(self, *args: Any) -> Outputs:
        check_request(args)
        loop = asyncio.get_running_loop()
        if self._arrived is None:  # made in the running loop: each worker process has its own
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._serve())
        done: asyncio.Future[Outputs] = loop.create_future()
        self._pending.append((args, done))
        self._arrived.set()
        return await done

    def _waiting_samples(self) -> int:
        return sum(len(request[0]) for request, _ in self._pending)

    async def _collect(self) -> list[tuple[Request, asyncio.Future[Outputs]]]:
        """The next batch: the first waiting request, and of whatever arrives within the wait
        budget each that still fits under the batch max, in arrival order (first fit: a later,
        smaller request may join ahead of a larger one that does not fit; the rest wait)."""
        assert self._arrived is not None
        while not self._pending:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = asyncio.get_running_loop().time() + self.max_wait_s
        while self._waiting_samples() < self.limit:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                break
        batch: list[tuple[Request, asyncio.Future[Outputs]]] = []
        waiting: list[tuple[Request, asyncio.Future[Outputs]]] = []
        filled = 0
        for entry in self._pending:
            size = len(entry[0][0])
            if not batch or filled + size <= self.limit:
                batch.append(entry)
                filled += size
            else:
                waiting.append(entry)
        self._pending = waiting
        return batch

    async def _serve(self) -> None:
        while True:
            batch = await self._collect()
            requests = [request for request, _ in batch]
            try:
                results = await self.threads.run(run_batch, self.model, requests, self.limit)
            except Exception as exc:  # the model failed: every request of the batch hears why
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (_, done), result in zip(batch, results):
                if not done.done():  # a client that went away cancelled its future
                    done.set_result(result)
