"""The live and plain forms of build progress (progress.py's module docstring says which is chosen
when): the client side of the renderer process (pipeline/services/live.py), which this one feeds
one JSON message a line, and ``for_stream``, which picks the form for a stream.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from .progress import Progress, QuietProgress, is_live_terminal, status_every_s


class LiveProgress(Progress):
    """Plain lines printed above a status area that redraws itself, drawn by a process of its own
    (pipeline/services/live.py says why): this one only sends it what changed, in order.
    ``plain_every_s``: off a terminal, that process prints a status line whenever nothing was
    printed for that long instead; it starts with the first stage (a command without stages,
    `index start` or `--version`, starts no process), and until then lines are printed here."""

    HEARTBEAT = False  # the renderer redraws the status four times a second, or prints it

    def __init__(self, stream: TextIO = sys.stderr, plain_every_s: float | None = None) -> None:
        super().__init__(stream)
        self.plain_every_s = plain_every_s
        self.renderer: subprocess.Popen | None = None
        self.redirected = (sys.stdout, sys.stderr)
        self.handlers: list[logging.StreamHandler] = []
        self.started = False
        # plain: a thread here prints the status until the renderer runs (or if none can be had)
        self.HEARTBEAT = plain_every_s is not None
        if plain_every_s is None:
            self._start_renderer()

    def _start_renderer(self) -> None:
        self.started = True
        stream, plain = self.stream, self.plain_every_s is not None
        package_parent = str(Path(__file__).resolve().parents[2])  # the folder that holds pipeline/
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
        # The renderer must outlive the build's last line, so Ctrl-C (sent to the whole process
        # group) must not reach it. On a terminal: SIGINT ignored from the start, inherited through
        # exec (no threads yet to make preexec_fn unsafe: this runs before torch is imported). Off
        # one, it starts with the first stage, when torch may have threads: a session of its own.
        began = time.monotonic() - (time.perf_counter() - self.began)  # the build's start, on the renderer's clock
        argv = [sys.executable, "-m", "pipeline.services.live", str(os.getpid()), repr(began)]
        self.renderer = subprocess.Popen(
            argv + ([repr(self.plain_every_s)] if plain else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stream.fileno(),
            env=env,
            **(
                {"start_new_session": True}
                if plain
                else {"preexec_fn": lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)}
            ),
        )
        self.redirected = (sys.stdout, sys.stderr)
        # Python's own writes to the terminal (a warning, a print in a model's code) go above the
        # area too, in order; stdout only where it is the terminal (not `matrix > file`), and
        # never in plain mode, whose renderer writes to stderr only.
        sys.stderr = _LinesTo(self, sys.stderr)
        if not plain and sys.stdout is not None and sys.stdout.isatty():
            sys.stdout = _LinesTo(self, sys.stdout)
        # --verbose's log lines too (logging's handler kept the stderr it was made with)
        self.handlers = [
            h
            for h in logging.getLogger().handlers
            if isinstance(h, logging.StreamHandler) and h.stream is self.redirected[1]
        ]
        for handler in self.handlers:
            handler.setStream(sys.stderr)
        self.HEARTBEAT = False
        if self.expected:  # what it was told before it ran
            self._send(expect=self.expected)

    def _send(self, **message: object) -> bool:
        """False once the renderer is gone (killed on its own): the build goes on in plain lines."""
        if self.renderer is None:
            return False
        pipe = self.renderer.stdin
        assert pipe is not None  # started with stdin=PIPE
        data = (json.dumps(message) + "\n").encode()
        try:
            while data:  # one write for a message under PIPE_BUF: the renderer never sees half of it
                data = data[os.write(pipe.fileno(), data) :]
        except OSError:
            self._end_renderer()
            return False
        return True

    def say(self, text: str) -> None:
        if not self._send(say=text):
            super().say(text)

    def step(self, text: str) -> None:
        super().step(text)
        self._send(step=text)

    def expect(self, stage_times: Mapping[str, float]) -> None:
        super().expect(stage_times)
        self._send(expect=self.expected)

    def estimate(self, stage_left_s: float | None, basis: str | None = None) -> None:
        super().estimate(stage_left_s, basis)
        end = None if stage_left_s is None else time.monotonic() + stage_left_s
        self._send(stage_end=end, basis=basis, revised=self.revised, finishing=self.finishing)

    def track(self, key: str, text: str) -> None:
        if not self._send(track=key, text=text):
            super().track(key, text)  # plain lines from here, where no stage started the renderer

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        if not self.started:
            try:
                self._start_renderer()
            except OSError:  # no process to be had (no free pid, no memory): the thread goes on
                pass
        with super().stage(name, detail):
            self._send(stage=name, began=time.monotonic())
            yield

    def stage_ended(self) -> None:
        # before the "done" line: sent after it, the row was drawn again under it for a moment (H48)
        self._send(stage=None)

    def close(self) -> None:
        for proxy in (sys.stdout, sys.stderr):
            if isinstance(proxy, _LinesTo):
                proxy.flush_line()
        sys.stdout, sys.stderr = self.redirected
        for handler in self.handlers:
            handler.setStream(sys.stderr)
        self.handlers = []
        self._end_renderer()

    def _end_renderer(self) -> None:
        """The end of the pipe is the renderer's cue: it prints what is left, erases the area, ends."""
        renderer, self.renderer = self.renderer, None
        if renderer is None:
            return
        assert renderer.stdin is not None  # started with stdin=PIPE
        try:
            renderer.stdin.close()
        except OSError:
            pass
        try:
            code = renderer.wait(timeout=10)
        except subprocess.TimeoutExpired:
            renderer.kill()
            code = renderer.wait()
        if code != 0 and self.plain_every_s is None:  # it died before it could show the cursor again
            self.stream.write("\x1b[?25h")
            self.stream.flush()


class _LinesTo(io.TextIOBase):
    """sys.stderr (or stdout) while the renderer draws: whole lines go to it as ``say``."""

    def __init__(self, progress: LiveProgress, original: TextIO) -> None:
        self.progress, self.original, self.pending = progress, original, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.progress.say(line)
        return len(text)

    def flush_line(self) -> None:
        if self.pending:
            self.progress.say(self.pending)
            self.pending = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.original.isatty()

    def fileno(self) -> int:
        return self.original.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.original.encoding


def for_stream(stream: TextIO = sys.stderr, *, quiet: bool = False, json: bool = False) -> Progress:
    if quiet:
        return QuietProgress(stream, None if json else sys.stdout)
    if is_live_terminal(stream):
        try:
            return LiveProgress(stream)
        except OSError:  # no renderer process to be had (no free pid, no memory): plain lines
            pass
    try:
        stream.fileno()
    except (OSError, ValueError):  # no file under it (a StringIO): plain lines from a thread here
        return Progress(stream)
    return LiveProgress(stream, plain_every_s=status_every_s())
