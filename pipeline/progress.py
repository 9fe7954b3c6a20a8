"""Build progress on stderr, in one of three forms chosen by ``for_stream``:

- plain lines (CI, a pipe, ``NO_COLOR``, ``TERM=dumb``): each stage's name when it starts, one
  line per finished candidate, its elapsed time when it ends; never a control character;
- live (a terminal): the same lines, under one status area that rich redraws four times a second
  with the stage, the candidate being compiled or timed (``2/4 freezing``), the elapsed time,
  and what is left where an earlier build of the same model gives its stage times;
- quiet (``--quiet``): only the result, or the error the CLI prints.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TextIO

# The signal that asked the build to stop, if any. A signal handler's exception can land where
# Python swallows it (a weakref callback inside torch), so stages also check this at each boundary.
stop_requested: list[str] = []

STAGES = ("load", "doctor", "export", "compile", "verify", "package")


def check_stop() -> None:
    if stop_requested:
        raise KeyboardInterrupt


def is_live_terminal(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    return (stream.isatty() and not environ.get("NO_COLOR") and environ.get("TERM", "") != "dumb"
            and environ.get("CI", "").lower() not in ("1", "true", "yes"))


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Plain lines."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.timings: dict[str, float] = {}
        self.expected: dict[str, float] = {}
        self.current: tuple[str, float] | None = None  # the running stage and when it began
        self.detail = ""

    def say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def result(self, text: str) -> None:
        """What the command produced: shown in every mode, --quiet included."""
        self.say(text)

    def step(self, text: str) -> None:
        """What the running stage is doing now (``2/4 freezing: compiling``): the live status."""
        self.detail = text

    def expect(self, stage_times: Mapping[str, float]) -> None:
        """An earlier build's stage times, for the estimate of what is left."""
        self.expected = dict(stage_times)

    def track(self, key: str, text: str) -> None:
        """One line per build of several built at once (live only)."""

    def close(self) -> None:
        pass

    def left_s(self) -> float | None:
        if not self.expected or self.current is None or self.current[0] not in STAGES:
            return None
        name, began = self.current
        later = STAGES[STAGES.index(name) + 1:]
        return max(0.0, self.expected.get(name, 0.0) - (time.perf_counter() - began)) + sum(self.expected.get(s, 0.0) for s in later)

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        check_stop()
        self.say(f"==> {name}" + (f": {detail}" if detail else ""))
        start = time.perf_counter()
        self.current, self.detail = (name, start), ""
        yield
        check_stop()
        elapsed = time.perf_counter() - start
        self.timings[name] = round(elapsed, 3)
        self.current, self.detail = None, ""
        self.say(f"    {name} done in {elapsed:.1f}s")


class QuietProgress(Progress):
    """Nothing but the result, on stdout (``result_stream``; None when --json prints there instead)."""

    def __init__(self, stream: TextIO = sys.stderr, result_stream: TextIO | None = sys.stdout) -> None:
        super().__init__(stream)
        self.result_stream = result_stream

    def say(self, text: str) -> None:
        pass

    def result(self, text: str) -> None:
        if self.result_stream is not None:
            print(text, file=self.result_stream, flush=True)


class LiveProgress(Progress):
    """Plain lines printed above a status area that redraws itself."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self.began = time.perf_counter()
        self.tracks: dict[str, str] = {}
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.spinner = Spinner("dots", text="starting")
        self.live = Live(get_renderable=self._status, console=self.console, refresh_per_second=4, transient=True)
        self.live.start()

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)
        self.live.refresh()  # the status under the line is redrawn from the stage it now describes

    def track(self, key: str, text: str) -> None:
        self.tracks[key] = text

    def close(self) -> None:
        self.live.stop()

    def _status(self):
        from rich.text import Text

        if self.tracks:
            self.spinner.update(text=Text("\n".join(f"{key}: {text}" for key, text in self.tracks.items())))
            return self.spinner
        if self.current is None:
            return Text("")
        name, began = self.current
        parts = [name + (f" {self.detail}" if self.detail else ""), f"{duration(time.perf_counter() - began)} in {name}",
                 f"{duration(time.perf_counter() - self.began)} in all"]
        left = self.left_s()
        if left is not None:
            parts.append(f"about {duration(left)} left (from the last build)")
        self.spinner.update(text=Text(" · ".join(parts)))
        return self.spinner


def for_stream(stream: TextIO = sys.stderr, *, quiet: bool = False, json: bool = False) -> Progress:
    if quiet:
        return QuietProgress(stream, None if json else sys.stdout)
    return LiveProgress(stream) if is_live_terminal(stream) else Progress(stream)
