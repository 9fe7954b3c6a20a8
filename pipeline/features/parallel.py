"""Compiling the search's candidates side by side, one forked process per core (issue 44).

A compile is mostly Python (Inductor's code generation) on one core, so candidates compiled
one after another leave the other cores idle. Each worker is a fork of the build: it has the
exported program already, compiles one candidate into its own folder and the build cache,
and returns how long that took; the build then takes the result from the cache and verifies
and times the candidates itself, one at a time. Forked, not spawned: a spawned worker would
import torch and load the model again (seconds), and Inductor's configuration is per process,
so threads could not share it.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CompileError, ExportError
from ..services.cache import Cache
from ..stages.compile import CompilePlan, compile_model
from ..stages.export import Exported

# Set in the parent just before forking: what a worker compiles from (not pickled: inherited).
_EXPORTED: list[Exported] = []


@dataclass(frozen=True)
class Done:
    name: str
    seconds: float  # the worker's compile time
    problem: str = ""  # the first line of its CompileError/ExportError, or ""


def _compile_one(name: str, plan: CompilePlan, work_dir: Path, cache_dir: Path) -> Done:
    # One thread per worker: the workers share the cores, and OpenMP's pool does not survive a fork.
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        # reuse off: the worker compiles (the parent asked for this one because the cache lacks it)
        compile_model(_EXPORTED[0], plan, work_dir, Cache(cache_dir, reuse=False))
    except (CompileError, ExportError) as exc:
        return Done(name, time.perf_counter() - started, exc.message)
    return Done(name, time.perf_counter() - started)


def compile_all(
    exported: Exported,
    jobs: list[tuple[str, CompilePlan, Path]],
    cache_dir: Path,
    workers: int,
    on_done: Callable[[dict[str, float]], None] | None = None,
) -> dict[str, Done]:
    """Compile each (name, plan, work folder) into ``cache_dir``, ``workers`` at a time. ``on_done``:
    called each time one finishes with those still to finish, and how long each has run (one queued
    starts as one finishes: the pool takes them in order), for the live row and its figure."""
    _EXPORTED[:] = [exported]
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_compile_one, name, plan, work, cache_dir): name for name, plan, work in jobs}
            now = time.perf_counter()
            began = {name: now for name, _, _ in jobs[:workers]}
            finished: dict[str, Done] = {}
            for future in as_completed(futures):
                finished[futures[future]] = future.result()
                now = time.perf_counter()
                left = [name for name, _, _ in jobs if name not in finished]
                for name, _, _ in jobs[: workers + len(finished)]:  # a finished one's slot takes the next
                    began.setdefault(name, now)
                if on_done is not None and left:
                    on_done({name: now - began.get(name, now) for name in left})
            return {name: finished[name] for name, _, _ in jobs}
    finally:
        _EXPORTED.clear()
