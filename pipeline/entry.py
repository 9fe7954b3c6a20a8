"""The process around the CLI (``modelwheel``, ``python -m pipeline``): an end that no thread the
model left running can hold up (tokenizer pools and telemetry threads are not daemons: the interpreter would wait for
them forever, past the build's own result, and a CI job would never end)."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn

from .cli import main
from .services import progress


def run() -> NoReturn:
    end(main())


def end(code: int) -> NoReturn:
    """Exit with ``code``: normally; or, where threads the model started are still running, or
    the command was stopped by a signal, at once, after flushing what was written."""
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if not left and not progress.stop_requested:
        sys.exit(code)
    if left:  # the interpreter's exit would wait on them
        logging.getLogger(__name__).info(
            "exiting past %d thread(s) the model left running: %s", len(left), ", ".join(left)
        )
    else:
        # A stop that landed while C code ran Python through PyRun_String (torch does, compiling)
        # leaves CPython's "unhandled KeyboardInterrupt" flag set, though the CLI handled it; the
        # interpreter's own exit would then kill the process by SIGINT (exit -2), past the code
        # the CLI chose and printed. The exit handlers still run (torch's compile workers end).
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is None:  # no such stream (pythonw, a closed descriptor at start)
            continue
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)
