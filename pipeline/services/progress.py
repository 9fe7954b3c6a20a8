"""Build progress on stderr, in one of three forms chosen by ``for_stream`` (live_progress.py):

- plain lines (CI, a pipe, ``NO_COLOR``, ``TERM=dumb``): each stage's name when it starts, one
  line per finished candidate, its elapsed time when it ends, and in between, whenever nothing
  was printed for ``STATUS_EVERY_S``, a ``...`` line saying what runs, how long it has run and
  about how long is left; never a control character. From the first stage on, a process of its
  own prints them (pipeline/services/live.py in plain mode), as a thread here could not while a
  model call holds the GIL;
- live (a terminal): the same lines, under one status area that rich redraws four times a second
  with the stage, the candidate being compiled or timed (``2/4 freezing``), the elapsed time,
  and what is left where an earlier build of the same model gives its stage times; a process of
  its own draws it (pipeline/services/live.py), so the time ticks on while the build holds the GIL;
- quiet (``--quiet``): only the result, or the error the CLI prints.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

# The signal that asked the build to stop, if any. A signal handler's exception can land where
# Python swallows it (a weakref callback inside torch), so stages also check this at each boundary.
stop_requested: list[str] = []

STAGES = ("load", "doctor", "export", "compile", "verify", "static", "package")  # static: only with static sizes


# A plain build says what it is doing when it printed nothing for this long (a pipe has no
# live area); MODELWHEEL_STATUS_EVERY_S changes it (the tests make it short). Under 15 s, the
# longest a user should wait for a line; the renderer's clock runs while the build holds the GIL.
STATUS_EVERY_S = 10.0
STATUS_ENV = "MODELWHEEL_STATUS_EVERY_S"


def status_every_s(environ: Mapping[str, str] = os.environ) -> float:
    try:
        seconds = float(environ.get(STATUS_ENV, ""))
    except ValueError:
        return STATUS_EVERY_S
    return seconds if seconds > 0 else STATUS_EVERY_S


def check_stop() -> None:
    if stop_requested:
        raise KeyboardInterrupt


def is_live_terminal(stream: TextIO, environ: Mapping[str, str] = os.environ) -> bool:
    return (
        stream.isatty()
        and not environ.get("NO_COLOR")
        and environ.get("TERM", "") != "dumb"
        and environ.get("CI", "").lower() not in ("1", "true", "yes")
    )


def took(seconds: float) -> str:
    """A stage's time, in ms where it would read 0.0s: a newcomer read a tiny model's "verify done
    in 0.0s" as a skipped check."""
    return f"{seconds:.1f}s" if seconds >= 0.05 else f"{max(1, round(seconds * 1000))}ms"


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def figure(value: float) -> str:
    """A measured time (the caller adds its unit) as a user reads it: three significant digits,
    whole numbers from 100 up, never an exponent (``2748``, ``27.5``, ``9``, ``0.0803``), where
    ``:.3g`` printed a 2.7 s timing round as ``2.75e+03`` ms."""
    rounded = float(f"{value:.3g}")  # 99.97 is 100: its decimals follow the rounded value
    if not math.isfinite(rounded) or rounded == 0:
        return f"{rounded:g}"
    decimals = min(6, max(0, 2 - math.floor(math.log10(abs(rounded)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def ratio(value: float) -> str:
    """A speed or spread ratio as figure() gives a time (``1.51x``, ``12.3x``, ``1414x``), where
    ``:.2f`` printed a spread over a stalled round as ``1414.02x``."""
    return f"{figure(value)}x" if math.isfinite(value) else "unbounded"


# What a stage's own estimate rests on where it says nothing else: this build's measured compiles
# (the search's, from its first). One wording for it, left or past: "estimated here" turned into
# "this build's estimate" for the same figure.
MEASURED_HERE = "from this build's compiles"


# A basis that begins so is the first compile's figure alone, in a search: said as "left of the first
# compile", as "left of compile (for the first compile only: …)" read to a newcomer as the stage's.
FIRST_COMPILE = "for the first compile only: "


def outlook(
    expected: Mapping[str, float],
    stage: str,
    in_stage_s: float,
    stage_left_s: float | None = None,
    basis: str | None = None,
) -> str | None:
    """About how long is left of a build in ``stage`` for ``in_stage_s``, from an earlier build's
    stage times; ``stage_left_s``: the stage's own estimate of what is left of it (the search's,
    once its first compile is timed), which replaces the earlier build's for this stage. A stage
    past its estimate says by how much: counted as done, it froze the figure at the later stages'
    (``about 1m50s left`` for 19 lines while the unet's compile ran 3.5 minutes over). ``basis``:
    what the stage's own estimate rests on, where it is not a measurement of this build's."""
    if stage not in STAGES:
        return None
    after = STAGES[STAGES.index(stage) + 1 :]
    # A first build says its figure is the stage's alone: "left of compile" there and "left of the
    # build" in the next read to a newcomer as the same figure said two ways.
    unknown = (
        "; no figure yet for the stages after it (this model's first build here)" if after and not expected else ""
    )
    if stage_left_s is None and basis is not None and stage not in expected:
        return basis + unknown  # no figure yet, and what gives one (the first candidate's cases)
    if not expected and stage_left_s is None:
        return None
    # Before the search's plan is known (the doctor makes it), the compile stage has no figure: the
    # last build's, whose candidates came fresh, made a cached --no-search build's doctor say "about
    # 2m31s left of the build" with 18 s to go. Then the stage's own figure is all there is to say.
    if "compile" in after and "compile" not in expected:
        expected = {name: seconds for name, seconds in expected.items() if name not in after}
    later = sum(expected.get(s, 0.0) for s in after)
    # "stage": the compile stage runs past its figure while it verifies a candidate, and "compile
    # running" read as if the compiler were still running
    then = f", then about {duration(later)} for the stages after it (from earlier builds)" if later >= 0.5 else ""
    if stage_left_s is not None and basis is not None and basis.startswith(FIRST_COMPILE):
        guess, rest = basis[len(FIRST_COMPILE) :], "the stage's figure comes once it is timed"
        if _at_estimate(stage_left_s):
            return f"the first compile finishing, at its estimate ({guess}); {rest}"
        if stage_left_s < 0:
            return f"the first compile running {duration(-stage_left_s)} past its estimate ({guess}); {rest}"
        return f"about {duration(stage_left_s)} left of the first compile ({guess}); {rest}"
    if stage_left_s is not None:
        if _at_estimate(stage_left_s):
            return f"{stage} stage finishing, at the estimate ({basis or MEASURED_HERE})" + (then or unknown)
        if stage_left_s < 0:
            estimate = f"the estimate ({basis or MEASURED_HERE})"
            return f"{stage} stage running {duration(-stage_left_s)} past {estimate}" + (then or unknown)
        if later < 0.5:  # "of compile": a newcomer could not tell the stage's figure from the build's
            return f"about {duration(stage_left_s)} left of {stage} ({basis or MEASURED_HERE})" + unknown
        # Two figures of two bases, said apart: "about 2m22s left (from the doctor's steps so far)"
        # read to a newcomer as the doctor's, 3 s before it ended (the rest was the later stages')
        return (
            f"about {duration(stage_left_s + later)} left of the build: {duration(stage_left_s)} of {stage} "
            f"({basis or MEASURED_HERE}), then {duration(later)} for the stages after it (from earlier builds)"
        )
    last = expected.get(stage)
    if last is None:  # the last build had no such stage (static sizes): what comes after it only
        return f"about {duration(later)} after this stage (from earlier builds)" if later >= 0.5 else None
    if _at_estimate(last - in_stage_s):
        return f"{stage} stage finishing, at its estimate of {duration(last)} (from earlier builds)" + then
    if in_stage_s > last:
        # "its estimate", not "the last build's": the compile's is the last build's scaled to this
        # build's compiles, and a newcomer looked for a 2m22s stage in a last build that took 47 s
        return (
            f"{stage} stage running {duration(in_stage_s - last)} past its estimate of {duration(last)} "
            "(from earlier builds)" + then
        )
    scope = "the build" if later >= 0.5 else stage
    return f"about {duration(last - in_stage_s + later)} left of {scope} (from earlier builds)"


def _at_estimate(left_s: float) -> bool:
    """Within half a second of the estimate, either side: "running 0s past the estimate" read to a
    newcomer as a warning, and "about 0s left" as a stall."""
    return abs(left_s) < 0.5


def brief(ahead: str | None) -> str | None:
    """outlook()'s figure without what it rests on: its parentheses and what follows a ';'."""
    if ahead is None:
        return None
    text, shorter = ahead.split("; ")[0], ""
    while shorter != text:  # nested parentheses, innermost first
        shorter, text = text, re.sub(r" \([^()]*\)", "", text)
    return text


def status_text(name: str, detail: str, in_stage_s: float, in_all_s: float, ahead: str | None) -> str:
    """One status: the stage and what it does (``compile 2/4 freezing: compiling``), its time, the
    build's, and ``ahead``: about how long is left (outlook())."""
    parts = [
        name + (f" {detail}" if detail else ""),
        f"{duration(in_stage_s)} in {name}",
        f"{duration(in_all_s)} in all",
    ]
    if ahead is not None:
        parts.append(ahead)
    return " · ".join(parts)


class Progress:
    """Plain lines."""

    HEARTBEAT = True  # a status line when nothing was printed for a while (not --quiet, not live)

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.timings: dict[str, float] = {}
        self.expected: dict[str, float] = {}
        self.current: tuple[str, float] | None = None  # the running stage and when it began
        self.detail = ""
        self.stage_end: float | None = None  # perf_counter() when the stage expects to end, if it said
        self.basis: str | None = None  # what that estimate rests on, where not this build's measurement
        self.began = self.last_line = time.perf_counter()
        self.every_s = status_every_s()
        self.lock = threading.Lock()  # the heartbeat's lines and the build's never interleave
        self.tracks: dict[str, str] = {}

    def say(self, text: str) -> None:
        with self.lock:
            print(text, file=self.stream, flush=True)
            self.last_line = time.perf_counter()

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
        """Each of several builds at once: its line of the live area; off a terminal, all of them
        on one status line whenever nothing was printed for a while."""
        self.tracks[key] = text
        if self.HEARTBEAT and time.perf_counter() - self.last_line >= self.every_s:
            self.say("    ... " + " | ".join(f"{name}: {status}" for name, status in self.tracks.items()))

    def close(self) -> None:
        pass

    def estimate(self, stage_left_s: float | None, basis: str | None = None) -> None:
        """The running stage's own estimate of what is left of it (the search's); None: none now."""
        self.stage_end = None if stage_left_s is None else time.perf_counter() + stage_left_s
        self.basis = basis

    def outlook(self) -> str | None:
        if self.current is None:
            return None
        name, began = self.current
        now = time.perf_counter()
        left = None if self.stage_end is None else self.stage_end - now
        return outlook(self.expected, name, now - began, left, self.basis)

    def status(self) -> str | None:
        """What the running stage is doing now, as one line (None between stages)."""
        current = self.current
        if current is None:
            return None
        now = time.perf_counter()
        return status_text(current[0], self.detail, now - current[1], now - self.began, self.outlook())

    def _heartbeat(self, done: threading.Event) -> None:
        while not done.wait(min(1.0, self.every_s)):
            with self.lock:
                text = self.status() if time.perf_counter() - self.last_line >= self.every_s else None
            if text and not done.is_set():
                self.say(f"    ... {text}")

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        check_stop()
        self.say(f"==> {name}" + (f": {detail}" if detail else ""))
        start = time.perf_counter()
        self.current, self.detail, self.stage_end, self.basis = (name, start), "", None, None
        done = threading.Event()
        if self.HEARTBEAT:
            threading.Thread(target=self._heartbeat, args=(done,), name="modelwheel-status", daemon=True).start()
        try:
            yield
        finally:
            done.set()
        check_stop()
        elapsed = time.perf_counter() - start
        self.timings[name] = round(elapsed, 3)
        self.current, self.detail, self.stage_end, self.basis = None, "", None, None
        self.say(f"    {name} done in {took(elapsed)}")


# The display the running command reports to: stages and the features under them say what they
# do through say() and step(), not through callbacks passed down their signatures.
_ACTIVE: ContextVar[Progress | None] = ContextVar("modelwheel_progress", default=None)


@contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Make ``progress`` the display say() and step() reach while inside."""
    token = _ACTIVE.set(progress)
    try:
        yield progress
    finally:
        _ACTIVE.reset(token)


def say(text: str) -> None:
    """A line of the running command's output (on stderr where no command set a display)."""
    active = _ACTIVE.get()
    if active is None:
        print(text, file=sys.stderr, flush=True)
    else:
        active.say(text)


def step(text: str) -> None:
    """What the running stage is doing now (``static 2/4 batch=4: compiling``): the live status."""
    active = _ACTIVE.get()
    if active is not None:
        active.step(text)


MANY_STEPS = 8  # a stage with this many steps or more estimates from their median (StepClock)


class StepClock:
    """A stage's own estimate from its steps (the verify stage's cases), said once it runs past the
    last build's figure, or where there is none: a step after the first (which opens and warms
    the model; their median, where there are MANY_STEPS) times the steps left. A --no-search unet
    build verified its ten cases in 38 s, against the 2.5 s of the last build's, whose search had
    verified the .so before.
    ``unlike``: the numbers of steps of another kind, left out of the figure (the doctor's dynamo
    trace, 5 of the unet's 8 s, made the eager calls after it look three times longer)."""

    BASIS = "from the cases verified so far"

    def __init__(self, stage: str, total: int, basis: str = BASIS, unlike: frozenset[int] = frozenset()) -> None:
        self.stage, self.total, self.basis, self.unlike = stage, total, basis, unlike
        self.began = time.perf_counter()
        self.until_s = 0.0  # the stage's seconds when the step before was done
        self.like: list[float] = []  # the seconds of the steps the figure is made from

    def done(self, number: int) -> None:
        """Step ``number`` (from 1) is done."""
        in_stage_s = time.perf_counter() - self.began
        took_s, self.until_s = in_stage_s - self.until_s, in_stage_s
        if number == 1 or number in self.unlike:
            return
        self.like.append(took_s)
        last = expected_s(self.stage)
        if last is not None and in_stage_s <= last:  # the last build's figure still holds
            return
        # Of many steps, the median of three or more: one slow case after the first made a newcomer's
        # ten cases "about 36s left" with 4 s to go. Of a few (the doctor's), the mean of what there is.
        if self.total >= MANY_STEPS and len(self.like) < 3:
            return
        per_step_s = statistics.median(self.like) if self.total >= MANY_STEPS else sum(self.like) / len(self.like)
        estimate(per_step_s * (self.total - number), self.basis)


class Steps:
    """A stage's steps numbered over all its phases (``2/5: graph breaks``), where they run in more than
    one module: the build's doctor runs the doctor's three checks, then its own (signal, the search's
    candidates), and numbering each part on its own said ``1/3 ... 3/3`` before its two longest steps."""

    def __init__(self, total: int, stage: str | None = None, unlike: frozenset[int] = frozenset()) -> None:
        self.total = total
        self.done = 0
        # ``stage``: the steps are the whole stage, which estimates what is left from them (a
        # model's first build showed the doctor's steps for a minute with no time left)
        self.clock = StepClock(stage, total, f"from the {stage}'s steps so far", unlike) if stage else None

    def __call__(self, text: str) -> None:
        if self.clock is not None and self.done:
            self.clock.done(self.done)  # the step before this one is done
        self.done += 1
        step(f"{self.done}/{self.total}: {text}")


def estimate(stage_left_s: float | None, basis: str | None = None) -> None:
    """About how long the running stage has left, by its own measure (the search's, from its first
    compile, its cases or steps, the noise rounds); None where it cannot say. ``basis``: what the
    figure rests on, said beside it (default: this build's compiles, MEASURED_HERE); with no figure,
    what will give one, said where the last build gives the stage none."""
    active = _ACTIVE.get()
    if active is not None:
        active.estimate(stage_left_s, basis)


def expected_s(stage: str) -> float | None:
    """How long ``stage`` took in the last build of this model here, if there was one."""
    active = _ACTIVE.get()
    return None if active is None else active.expected.get(stage)


class QuietProgress(Progress):
    """Nothing but the result, on stdout (``result_stream``; None when --json prints there instead)."""

    HEARTBEAT = False

    def __init__(self, stream: TextIO = sys.stderr, result_stream: TextIO | None = sys.stdout) -> None:
        super().__init__(stream)
        self.result_stream = result_stream

    def say(self, text: str) -> None:
        pass

    def result(self, text: str) -> None:
        if self.result_stream is not None:
            print(text, file=self.result_stream, flush=True)
