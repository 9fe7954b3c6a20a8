"""Stage progress on stderr: each stage's name when it starts and its elapsed time when it ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


# The signal that asked the build to stop, if any. A signal handler's exception can land where
# Python swallows it (a weakref callback inside torch), so stages also check this at each boundary.
stop_requested: list[str] = []


def check_stop() -> None:
    if stop_requested:
        raise KeyboardInterrupt


class Progress:
    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.timings: dict[str, float] = {}

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        check_stop()
        self.say(f"==> {name}" + (f": {detail}" if detail else ""))
        start = time.perf_counter()
        yield
        check_stop()
        elapsed = time.perf_counter() - start
        self.timings[name] = round(elapsed, 3)
        self.say(f"    {name} done in {elapsed:.1f}s")
