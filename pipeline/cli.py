"""`python -m pipeline build --spec PATH`: parse arguments, run the build, turn errors into exit codes.

This is the only place that catches PipelineError; tracebacks are shown only with --verbose. What
each command does is handlers.py's (COMMANDS); here: the signals, the progress display, the
error's message and exit code, and the --json record.
"""

from __future__ import annotations

import _thread
import argparse
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TextIO

from .arguments import parse
from .errors import BuildInterrupted, PipelineError
from .handlers import COMMANDS
from .services import record
from .services.layout import WorkLayout
from .services.live_progress import for_stream
from .services.proc import RedactingFilter, redact
from .services.progress import stop_requested

_settled = threading.Event()


# Where a KeyboardInterrupt must not be raised: a dispatch mode's Python code, called from torch's
# C++. Raised there while a build traced, it left FakeTensorMode set twice, and the process ended
# in "terminate called after throwing an instance of 'c10::Error'" (SIGABRT), not with its exit code.
IN_TORCH_DISPATCH = frozenset({"__torch_dispatch__", "__torch_function__"})
REDELIVER_S = 0.01


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    # KeyboardInterrupt, not an Exception: torch's own `except Exception` handlers must not swallow it.
    name = signal.Signals(signum).name
    if name not in stop_requested:
        stop_requested.append(name)
    if _in_torch_dispatch(frame):  # a moment later, outside it
        _later(_interrupt_main_unless_settled, signal.Signals(signum))
        return
    raise KeyboardInterrupt


def _in_torch_dispatch(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name in IN_TORCH_DISPATCH:
            return True
        frame = frame.f_back
    return False


def _later(function: Callable[[signal.Signals], None], signum: signal.Signals) -> None:
    timer = threading.Timer(REDELIVER_S, function, args=(signum,))
    timer.daemon = True
    timer.start()


def _redeliver_swallowed_interrupt(unraisable: sys.UnraisableHookArgs) -> None:
    """sys.unraisablehook: the KeyboardInterrupt landed in a finalizer or a garbage-collector
    callback (torch runs many), where Python prints it and drops it; the build then went on
    compiling until the stage ended, and stored its result in the cache. Deliver it again, from
    a moment later, so it lands in the build's own code."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and stop_requested:
        # Not from here: raised inside this hook, Python would drop it again.
        _later(_interrupt_main_unless_settled, signal.Signals[stop_requested[0]])
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_main_unless_settled(signum: signal.Signals) -> None:
    # Once main() has its outcome, a late re-delivery would only kill the process by SIGINT
    # (exit -2) after it printed its error, instead of exiting with BuildInterrupted's code.
    if not _settled.is_set():
        _thread.interrupt_main(signum)


def _settle() -> None:
    """The command's outcome is decided: later signals are recorded, never raised."""
    _settled.set()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: stop_requested.append(signal.Signals(number).name))


def _interrupted(args: argparse.Namespace) -> BuildInterrupted:
    """A stop outside build() (which says itself what it left): before the build began, or the
    parent of several builds, whose logs say what each left."""
    name = stop_requested[0] if stop_requested else "SIGINT"
    if args.command != "build":
        return BuildInterrupted(f"{args.command} stopped by {name}", "run the command again")
    if isinstance(args.spec, list) and len(args.spec) > 1:
        logs = WorkLayout(Path(args.build_dir)).logs_dir
        return BuildInterrupted(
            f"build stopped by {name}: each build's log in {logs}/ says what it left "
            f"(nothing under the artifact root, in {args.dist} or in the build cache)",
            "run the build again",
        )
    return BuildInterrupted(f"build stopped by {name} before it wrote anything", "run the build again")


def json_stdout() -> TextIO:
    """The real stdout, kept for the one JSON record; from here on fd 1 and sys.stdout are the
    process's stderr, so what the model prints (from Python or from its C libraries) goes there."""
    sys.stdout.flush()
    saved = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return saved


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    if not args.verbose:
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
    # What this process and its children (torch, the compiler) make is never writable by group or
    # others, whatever the umask: under umask 000 the build folder's cache and locks were 0777/0666.
    os.umask(os.umask(0o022) | 0o022)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    sys.unraisablehook = _redeliver_swallowed_interrupt
    args.records = []  # what --json prints: one entry per wheel built
    args.extra = {}  # and what other commands add to it (doctor's findings, publish's uploads)
    json_stream = json_stdout() if args.json else None
    progress = for_stream(sys.stderr, quiet=args.quiet, json=args.json)
    error: PipelineError | None = None
    try:
        code = COMMANDS[args.command](args, progress)
    except KeyboardInterrupt:
        _settle()
        error = _interrupted(args)
    except PipelineError as exc:
        _settle()
        # e.g. the C++ compiler killed by the same Ctrl-C: report the stop, not its side effect
        error = _interrupted(args) if stop_requested and not isinstance(exc, BuildInterrupted) else exc
    finally:
        _settle()
        progress.close()
    if error is not None:
        code = error.exit_code
        if args.verbose and error.__traceback__ is not None:
            print(redact("".join(traceback.format_exception(error))), end="", file=sys.stderr)
        print(redact(f"error: {error.message}"), file=sys.stderr)
        if error.hint:
            print(redact(f"hint: {error.hint}"), file=sys.stderr)
    if args.json or getattr(args, "json_out", None):
        record.emit(record.of_command(args, code, error), getattr(args, "json_out", None), json_stream)
    return code
