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

import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

from .wording import PART_ONLY, outlook, overran, status_text, took

# The signal that asked the build to stop, if any. A signal handler's exception can land where
# Python swallows it (a weakref callback inside torch), so stages also check this at each boundary.
stop_requested: list[str] = []


# A plain build says what it is doing when it printed nothing for this long (a pipe has no
# live area); MODELWHEEL_STATUS_EVERY_S changes it (the tests make it short). Under 15 s, the
# longest a user should wait for a line; the renderer's clock runs while the build holds the GIL.
STATUS_EVERY_S = 10.0
STATUS_ENV = "MODELWHEEL_STATUS_EVERY_S"
# A new figure ending this much later than the one said is "revised": a few seconds either way is the
# figure following the work, not a new estimate worth a word.
REVISED_S = 10.0


def held(left_s: float, finishing: bool) -> float:
    """The figure said: where the last one said "finishing" and the next came back with under
    REVISED_S to go, "finishing" holds until that one runs out too (H53: "finishing, at the revised
    estimate", then "about 2s left of compile, revised", read as a hiccup)."""
    return min(left_s, 0.0) if finishing else left_s


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
        self.revised = False  # the stage ran past an estimate before the one it has now
        self.finishing = False  # a figure came back after the last ran out: said as finishing (holds())
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
        now = time.perf_counter()
        left_s = None if self.stage_end is None else held(self.stage_end - now, self.finishing)
        # said as finishing: a figure past its end (running Ns past) is revised in numbers, and a figure
        # held at finishing revises nothing the user saw (H55: "finishing, at the revised estimate"
        # after "running 10s past the estimate", with no revised figure ever shown)
        finishing = left_s is not None and abs(left_s) < 0.5 and stage_left_s is not None and stage_left_s < REVISED_S
        if self.current is not None and not self.revised and not finishing:
            self.revised = self._revises(now, stage_left_s, basis)
        self.finishing = finishing
        self.stage_end = None if stage_left_s is None else now + stage_left_s
        self.basis = basis

    def _revises(self, now: float, stage_left_s: float | None, basis: str | None) -> bool:
        """Whether a new estimate revises the stage's figure: the last one ran out (overran()), or this
        one ends over REVISED_S later than it did (a newcomer's "about 9s left", then "about 1m12s
        left"), the stage's own or, where it had none, the earlier builds' (H47: "about 3m31s left of
        the build", then 3m48s, with no word). The end of one part's figure (the first compile's
        guess, the first candidate's verification) is no revision: the stage's own comes after it."""
        if PART_ONLY.match(self.basis or "") and basis != self.basis:
            return False
        assert self.current is not None
        stage, in_stage_s = self.current[0], now - self.current[1]
        left_s = None if self.stage_end is None else self.stage_end - now
        if overran(self.expected, stage, in_stage_s, left_s):
            return True
        if left_s is None and stage in self.expected:  # the figure said was the earlier builds'
            left_s = self.expected[stage] - in_stage_s
        return left_s is not None and stage_left_s is not None and stage_left_s - left_s > REVISED_S

    def outlook(self) -> str | None:
        if self.current is None:
            return None
        name, began = self.current
        now = time.perf_counter()
        left = None if self.stage_end is None else held(self.stage_end - now, self.finishing)
        return outlook(self.expected, name, now - began, left, self.basis, self.revised)

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
        self.current, self.detail, self.stage_end, self.basis, self.revised = (name, start), "", None, None, False
        self.finishing = False
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
        self.stage_ended()
        self.say(f"    {name} done in {took(elapsed)}")

    def stage_ended(self) -> None:
        """The stage is over, just before its "done" line: a display drawing the stage's row clears it here."""


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
FIXED_PART = 0.25  # of a sized step's time (StepClock): the unet's batch-8 case took 3.3x a batch-2 one, quiet


class StepClock:
    """A stage's own estimate from its steps (the verify stage's cases), said once it runs past the
    last build's figure, or where there is none: a step after the first (which opens and warms
    the model; their median, where there are MANY_STEPS) times the steps left. A --no-search unet
    build verified its ten cases in 38 s, against the 2.5 s of the last build's, whose search had
    verified the .so before.
    ``unlike``: the numbers of steps of another kind, left out of the figure (the doctor's dynamo
    trace, 5 of the unet's 8 s, made the eager calls after it look three times longer)."""

    BASIS = "from the cases verified so far"

    def __init__(
        self,
        stage: str,
        total: int,
        basis: str = BASIS,
        unlike: frozenset[int] = frozenset(),
        sizes: list[float] | None = None,
        weights: list[float] | None = None,
        then_s: float = 0.0,
    ) -> None:
        """``sizes``: each step's work, relative (the verify cases' input elements): a newcomer's
        unet said "about 4s left" before its batch-8 case, which took 20 s. ``weights``: each
        step's work where it is counted instead (the doctor's eager calls), taken as they are.
        ``then_s``: what the stage has left after these steps (a search's candidates after this one)."""
        self.stage, self.total, self.basis, self.unlike, self.then_s = stage, total, basis, unlike, then_s
        mean = sum(sizes) / len(sizes) if sizes else 1.0
        # a quarter of a step's time taken as fixed (opening, Python), the rest as growing with its
        # size: under load the threads' waits grow with the work (H41: "about 3s left" of 30 s)
        self.weights = weights or (
            [FIXED_PART + (1 - FIXED_PART) * size / mean for size in sizes] if sizes and mean else [1.0] * total
        )
        self.began = time.perf_counter()
        self.until_s = 0.0  # the stage's seconds when the step before was done
        self.like: list[float] = []  # the seconds of the steps the figure is made from, per unit of weight

    def pending(self) -> str:
        """Said until the figure comes: after how many steps (the first is left out, and of many, three
        more make their median). H66 read "known once its first cases are verified" at case 4 of 10,
        three of them done, as stuck."""
        needed = min(self.total, 1 + (3 if self.total >= MANY_STEPS else 1))
        return f"time left: known once {needed} of its {self.total} cases are verified"

    def done(self, number: int) -> None:
        """Step ``number`` (from 1) is done."""
        in_stage_s = time.perf_counter() - self.began
        took_s, self.until_s = in_stage_s - self.until_s, in_stage_s
        # the last: nothing left to estimate ("finishing, at its estimate" right after "running 1s past
        # it" read as the line going back, H44); what follows is the stage's own end
        if number == 1 or number in self.unlike or number == self.total:
            return
        self.like.append(took_s / self.weights[number - 1])
        last = expected_s(self.stage)
        if last is not None and in_stage_s <= last:  # the last build's figure still holds
            return
        # Of many steps, the median of three or more: one slow case after the first made a newcomer's
        # ten cases "about 36s left" with 4 s to go. Of a few (the doctor's), the mean of what there is.
        if self.total >= MANY_STEPS and len(self.like) < 3:
            return
        per_step_s = statistics.median(self.like) if self.total >= MANY_STEPS else sum(self.like) / len(self.like)
        estimate(per_step_s * sum(self.weights[number:]) + self.then_s, self.basis)


class Steps:
    """A stage's steps numbered over all its phases (``2/5: graph breaks``), where they run in more than
    one module: the build's doctor runs the doctor's three checks, then its own (signal, the search's
    candidates), and numbering each part on its own said ``1/3 ... 3/3`` before its two longest steps."""

    def __init__(
        self,
        total: int,
        stage: str | None = None,
        unlike: frozenset[int] = frozenset(),
        weights: list[float] | None = None,
    ) -> None:
        self.total = total
        self.done = 0
        # ``stage``: the steps are the whole stage, which estimates what is left from them (a
        # model's first build showed the doctor's steps for a minute with no time left)
        basis = f"from the {stage}'s steps so far"
        self.clock = StepClock(stage, total, basis, unlike, weights=weights) if stage else None

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
