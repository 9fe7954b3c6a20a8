"""The live status area on a terminal, drawn by a small process of its own.

A build spends long stretches inside C++ calls that hold the GIL (AOTInductor's runner holds it
for a whole model call, 40-130 ms for unet, called many times back to back while a candidate is
verified or timed), so a drawing thread in the build's own process is starved and the elapsed
time stops for seconds. This process owns the terminal while the build runs: the build writes
one JSON message a line to its stdin (``LiveProgress`` in live_progress.py), and it prints the lines
it is sent above a status area that rich redraws four times a second, ticking the time itself.

Messages, in the order the build sent them: ``{"say": text}`` (a line to print above the area),
``{"stage": name or null, "began": t}``, ``{"step": text}`` (the candidate and what is done to
it), ``{"expect": {stage: seconds}}`` (an earlier build's stage times), ``{"stage_end": t,
"basis": text or null, "revised": bool, "finishing": bool}`` (when the stage expects to end, by its
own estimate, what that rests on, whether it ran past an earlier one, and whether it is said as
finishing until then: progress.held()), ``{"track": key,
"text": text}`` (one line per build of several). Times are ``time.monotonic()``, one clock for
every process of the machine (CLOCK_MONOTONIC).

Off a terminal (a pipe, a log file: ``plain`` mode, its interval in argv[3]) it prints the same
lines, and in place of the area a ``    ... `` status line whenever nothing was printed for that
interval: a thread in the build's process could not, while a model call there holds the GIL
(verifying the unet on a loaded 2-core machine left 16-18 s between lines).

It ends when its stdin ends: the build closed it, or the build died (a crash, SIGKILL), or when
the build is gone while something the build forked still holds the pipe. Ctrl-C reaches the
whole process group; this process ignores SIGINT and SIGTERM, so it prints every line the build
sends while it stops and only then ends, erasing the area and showing the cursor again.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .progress import held
from .wording import brief, duration, outlook, status_text

if TYPE_CHECKING:  # plain mode imports no rich
    from rich.console import RenderableType
    from rich.spinner import Spinner

POLL_S = 0.5  # how often an idle renderer checks that the build is still there


class Status:
    """What the area shows; written by the reading loop, read by rich's refresh thread."""

    def __init__(self, began: float) -> None:
        self.began = began
        self.stage: tuple[str, float] | None = None
        self.detail = ""
        self.stage_end: float | None = None  # when the stage expects to end, by its own estimate
        self.basis: str | None = None  # what that estimate rests on (first_guess.py's), if not measured
        self.revised = False  # the stage ran past an estimate before this one (Progress.estimate says)
        self.finishing = False  # said as finishing until stage_end (progress.held())
        self.expected: dict[str, float] = {}
        self.tracks: dict[str, str] = {}
        self.spinner: Spinner | None = None  # rich's, made on the first draw (plain mode imports no rich)

    def apply(self, message: dict) -> None:
        if "stage" in message:
            self.stage = None if message["stage"] is None else (message["stage"], message["began"])
            self.detail, self.stage_end, self.basis, self.revised, self.finishing = "", None, None, False, False
        elif "stage_end" in message:
            self.stage_end, self.basis = message["stage_end"], message.get("basis")
            self.revised = message.get("revised", False)
            self.finishing = message.get("finishing", False)
        elif "step" in message:
            self.detail = message["step"]
        elif "expect" in message:
            self.expected = message["expect"]
        elif "track" in message:
            self.tracks[message["track"]] = message["text"]

    def _now(self) -> tuple[str, float, float, str | None] | None:
        """The running stage, its seconds so far, the build's, and outlook()'s figure (None between stages)."""
        stage = self.stage
        if stage is None:
            return None
        (name, began), now, end = stage, time.monotonic(), self.stage_end
        left = None if end is None else held(end - now, self.finishing)
        ahead = outlook(self.expected, name, now - began, left, self.basis, self.revised)
        return name, now - began, now - self.began, ahead

    def line(self) -> str | None:
        """The running stage's status, as Progress.status() words it (None between stages)."""
        now = self._now()
        return None if now is None else status_text(now[0], self.detail, *now[1:])

    def area(self) -> str | None:
        """The live area's rows: what runs, the times, then the figure left, without what it rests on
        (the scrolled lines say that). In one row, 'about 56s left' was cut off on an 80-column
        terminal; beside the times, 'compile stage finishing, at the revised estimate' was too."""
        now = self._now()
        if now is None:
            return None
        name, in_stage_s, in_all_s, ahead = now
        rows = [
            name + (f" {self.detail}" if self.detail else ""),
            f"  {duration(in_stage_s)} in {name} · {duration(in_all_s)} in all",
        ]
        return "\n".join(rows + [f"  {short}" for short in [brief(ahead)] if short])

    def render(self) -> RenderableType:
        from rich.spinner import Spinner
        from rich.text import Text

        if self.spinner is None:
            self.spinner = Spinner("dots")
        if self.tracks:
            return self._rows("\n".join(f"{key}: {text}" for key, text in self.tracks.items()))
        area = self.area()
        return Text("") if area is None else self._rows(area)

    def _rows(self, rows: str) -> RenderableType:
        """The spinner's frame, then the rows, each cut at a word with '…' where the terminal is
        too narrow: wrapped, then cut by the live area, 'then 18s for the later s' read as the whole
        of it (H41); cut at a character, 'for the later s…' (H42)."""
        assert self.spinner is not None
        frame = self.spinner.render(time.monotonic())  # its text left empty: the frame alone, a Text
        return _CutRows(frame, rows)


class _CutRows:
    """The rows as rich renders them at the terminal's width (known only then), each cut at a word."""

    def __init__(self, frame: Any, rows: str) -> None:
        self.frame, self.rows = frame, rows.split("\n")

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        frame = self.frame if isinstance(self.frame, Text) else Text(str(self.frame))
        width = options.max_width
        first = Text.assemble(frame, " ", cut_at_word(self.rows[0], width - frame.cell_len - 1))
        yield Text("\n").join([first, *(Text(cut_at_word(row, width)) for row in self.rows[1:])])


def cut_at_word(row: str, width: int) -> str:
    """``row`` in ``width`` cells: whole, or cut after its last whole word that fits, with '…'."""
    from rich.cells import cell_len

    if cell_len(row) <= width:
        return row
    kept = row[: max(width - 1, 0)]
    while kept and cell_len(kept) > width - 1:  # wide characters take two cells
        kept = kept[:-1]
    if " " in kept.strip() and not row[len(kept)].isspace():
        kept = kept[: kept.rstrip().rfind(" ")]
    return kept.rstrip(" ,;:·") + "…"


def messages(fd: int, build_pid: int) -> Iterator[dict[str, Any] | None]:
    """Each message the build sends, until its end of the pipe is closed or the build is gone;
    None whenever none came for POLL_S (plain mode's cue to look at the clock)."""
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if not ready:
            if os.getppid() != build_pid:  # the build died; a process it forked keeps the pipe open
                return
            yield None
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:  # half a message: the build was killed while it wrote
                continue


def plain(status: Status, build_pid: int, every_s: float) -> None:
    """The build's lines as they come, and its status whenever nothing was printed for ``every_s``
    (the build's tracks instead, while it runs several builds), on this process's clock."""
    last = time.monotonic()
    for message in messages(sys.stdin.fileno(), build_pid):
        if message is not None:
            status.apply(message)
            if "say" in message:
                print(message["say"], file=sys.stderr, flush=True)
                last = time.monotonic()
        if time.monotonic() - last < every_s:
            continue
        if status.tracks:
            line: str | None = " | ".join(f"{name}: {text}" for name, text in status.tracks.items())
        else:
            line = status.line()
        if line is not None:
            print(f"    ... {line}", file=sys.stderr, flush=True)
            last = time.monotonic()


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    build_pid, began = int(sys.argv[1]), float(sys.argv[2])
    status = Status(began)
    if len(sys.argv) > 3:  # plain mode: no terminal to draw on
        plain(status, build_pid, float(sys.argv[3]))
        return
    from rich.console import Console
    from rich.live import Live

    console = Console(file=sys.stderr, highlight=False, soft_wrap=True)
    live = Live(
        get_renderable=status.render,
        console=console,
        refresh_per_second=4,
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )
    live.start()
    try:
        for message in messages(sys.stdin.fileno(), build_pid):
            if message is None:
                continue
            status.apply(message)
            if "say" in message:
                console.print(message["say"], markup=False, highlight=False)
            if "say" in message or "stage" in message:
                live.refresh()  # the area under the line is redrawn from the stage it now describes
    finally:
        live.stop()  # erases the area, shows the cursor


if __name__ == "__main__":
    main()
