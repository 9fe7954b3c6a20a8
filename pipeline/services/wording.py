"""How the build says times, ratios and the time left: the words of its status lines and
summary, apart from the display that prints them (progress.py, live.py). Imports nothing of
modelwheel's."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping


def under_make() -> bool:
    """Whether make started this run (its hints then say make's way: ARGS="…")."""
    return bool(os.environ.get("MAKELEVEL"))


def make_command() -> str:
    """``make <target>`` of the make target running this command (the Makefile exports its name),
    for a hint that names it again: ``make build`` where make did not say."""
    return f"make {os.environ.get('MODELWHEEL_MAKE_TARGET') or 'build'}"


def as_run(make: str, tool: str) -> str:
    """A hint's command as this run was started: ``make``'s where make ran it, else the tool's own,
    with make's named for a checkout (H60: the pip-installed tool's hints, run from /, said
    `make build` and `make publish ARGS=…`, where no make target exists)."""
    return make if under_make() else f"{tool} ({make} in a checkout)"


STAGES = ("load", "doctor", "export", "compile", "verify", "static", "package")  # static: only with static sizes


def took(seconds: float) -> str:
    """A stage's time, in ms where it would read 0.0s: a newcomer read a tiny model's "verify done
    in 0.0s" as a skipped check. Decided on the ms it would say: a cut at 0.05 s said "verify done in
    50ms" of 0.0496 s and "verify 0.1s" of the same time as the report rounds it (0.050)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms}ms" if ms < 100 else f"{seconds:.1f}s"


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def listed(names: list[str]) -> str:
    """``a, b and c``: a list a reader can tell from the next one (two comma lists in one clause
    ran together for a newcomer)."""
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def figure(value: float, digits: int = 3) -> str:
    """A measured time (the caller adds its unit) as a user reads it: three significant digits,
    whole numbers from 100 up, never an exponent (``2748``, ``27.5``, ``9``, ``0.0803``), where
    ``:.3g`` printed a 2.7 s timing round as ``2.75e+03`` ms."""
    rounded = float(f"{value:.{digits}g}")  # 99.97 is 100: its decimals follow the rounded value
    if not math.isfinite(rounded) or rounded == 0:
        return f"{rounded:g}"
    decimals = min(6 + digits - 3, max(0, digits - 1 - math.floor(math.log10(abs(rounded)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def apart(first: float, second: float) -> tuple[str, str]:
    """Two figures compared in a line, with the digits that tell them apart: "its slowest round
    (0.119 ms) is faster than spec-options's fastest (0.119 ms)" read as false (H52: 0.119245
    against 0.119321)."""
    for digits in range(3, 7):
        said = figure(first, digits), figure(second, digits)
        if said[0] != said[1]:
            break
    return said


def ratio(value: float) -> str:
    """A speed or spread ratio as figure() gives a time (``1.51x``, ``12.3x``, ``1414x``), where
    ``:.2f`` printed a spread over a stalled round as ``1414.02x``."""
    return f"{figure(value)}x" if math.isfinite(value) else "unbounded"


# What a stage's own estimate rests on where it says nothing else: this build's measured compiles
# (the search's, from its first). One wording for it, left or past: "estimated here" turned into
# "this build's estimate" for the same figure.
MEASURED_HERE = "from this build's compiles"


# A basis that begins "for <part> only: " is a figure of that part of the stage alone, in a search:
# said as "left of the first compile", as "left of compile (for the first compile only: …)" read
# to a newcomer as the stage's; and "about 2s left of compile", the first candidate's verification
# alone, said on a terminal 3 minutes before the stage ended.
PART_ONLY = re.compile(r"for (.+?) only: (.*)")


def part_only(part: str) -> str:
    """The start of a basis of ``part``'s figure alone (PART_ONLY)."""
    return f"for {part} only: "


FIRST_COMPILE = part_only("the first compile")


def outlook(
    expected: Mapping[str, float],
    stage: str,
    in_stage_s: float,
    stage_left_s: float | None = None,
    basis: str | None = None,
    revised: bool = False,
) -> str | None:
    """About how long is left of a build in ``stage`` for ``in_stage_s``, from an earlier build's
    stage times; ``stage_left_s``: the stage's own estimate of what is left of it (the search's,
    once its first compile is timed), which replaces the earlier build's for this stage. A stage
    past its estimate says by how much: counted as done, it froze the figure at the later stages'
    (``about 1m50s left`` for 19 lines while the unet's compile ran 3.5 minutes over). ``basis``:
    what the stage's own estimate rests on, where it is not a measurement of this build's.
    ``revised``: the stage ran past an estimate before this one (overran()), said as "the revised
    estimate": "running 12s past the estimate", then "finishing, at the estimate", read to a
    newcomer as a clock going backwards."""
    if stage not in STAGES:
        return None
    after = STAGES[STAGES.index(stage) + 1 :]
    # A first build says its figure is the stage's alone: "left of compile" there and "left of the
    # build" in the next read to a newcomer as the same figure said two ways.
    unknown = (
        "; no figure yet for the stages after it (the build cache holds no earlier build of this model on as many "
        "threads)"
        if after and not expected
        else ""
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
    # past or at it, "the revised estimate (basis)"; a figure left, "(revised, basis)"
    the_estimate = f"the {'revised ' if revised else ''}estimate ({basis or MEASURED_HERE})"
    basis_said = f"revised, {basis or MEASURED_HERE}" if revised else basis or MEASURED_HERE
    if stage_left_s is not None and basis is not None and (part := PART_ONLY.fullmatch(basis)):
        what, guess = part[1], part[2]
        rest = "the stage's figure comes " + ("once it is timed" if basis.startswith(FIRST_COMPILE) else "after it")
        its = "its revised estimate" if revised else "its estimate"
        if _at_estimate(stage_left_s):
            return f"{what} finishing, at {its} ({guess}); {rest}"
        if stage_left_s < 0:
            return f"{what} running {duration(-stage_left_s)} past {its} ({guess}); {rest}"
        guess = f"revised, {guess}" if revised else guess
        return f"about {duration(stage_left_s)} left of {what} ({guess}); {rest}"
    if stage_left_s is not None:
        if _at_estimate(stage_left_s):
            return f"{stage} stage finishing, at {the_estimate}" + (then or unknown)
        if stage_left_s < 0:
            return f"{stage} stage running {duration(-stage_left_s)} past {the_estimate}" + (then or unknown)
        if later < 0.5:  # "of compile": a newcomer could not tell the stage's figure from the build's
            return f"about {duration(stage_left_s)} left of {stage} ({basis_said})" + unknown
        # Two figures of two bases, said apart: "about 2m22s left (from the doctor's steps so far)"
        # read to a newcomer as the doctor's, 3 s before it ended (the rest was the later stages')
        return (
            f"about {duration(stage_left_s + later)} left of the build: {duration(stage_left_s)} of {stage} "
            f"({basis_said}), then {duration(later)} for the stages after it (from earlier builds)"
        )
    last = expected.get(stage)
    # both figures from earlier builds, said once ("(from earlier builds)" twice in one line)
    both = (then.removesuffix(" (from earlier builds)") if then else "") + " (from earlier builds)"
    if last is None:  # the last build had no such stage (static sizes): what comes after it only
        return f"about {duration(later)} after this stage (from earlier builds)" if later >= 0.5 else None
    if _at_estimate(last - in_stage_s):
        if last < 0.5:  # "load stage finishing, at its estimate of 0s", in every build after the first
            return f"about {duration(later)} left of the build (from earlier builds)" if later >= 0.5 else None
        return f"{stage} stage finishing, at its estimate of {duration(last)}{both}"
    if in_stage_s > last:
        # "its estimate", not "the last build's": the compile's is the last build's scaled to this
        # build's compiles, and a newcomer looked for a 2m22s stage in a last build that took 47 s
        return f"{stage} stage running {duration(in_stage_s - last)} past its estimate of {duration(last)}{both}"
    scope = "the build" if later >= 0.5 else stage
    return f"about {duration(last - in_stage_s + later)} left of {scope} (from earlier builds)"


def overran(expected: Mapping[str, float], stage: str, in_stage_s: float, stage_left_s: float | None) -> bool:
    """Whether outlook() says now that ``stage`` runs past its estimate (its own, else the last
    build's figure): a new estimate after that is a revised one."""
    last = expected.get(stage) if stage_left_s is None else None
    left_s = stage_left_s if stage_left_s is not None else None if last is None else last - in_stage_s
    return left_s is not None and left_s < 0 and not _at_estimate(left_s)


def _at_estimate(left_s: float) -> bool:
    """Within half a second of the estimate, either side: "running 0s past the estimate" read to a
    newcomer as a warning, and "about 0s left" as a stall."""
    return abs(left_s) < 0.5


def brief(ahead: str | None) -> str | None:
    """outlook()'s figure for the live area's own row, under the stage's: without what it rests on
    (its parentheses and what follows a ';') but with what it covers, ``revised`` kept (a newcomer's
    "about 30s left of compile" followed "running 34s past the estimate" with no word of it), and
    without the stage's name, which the row above says."""
    if ahead is None:
        return None
    text, shorter = ahead.split("; ")[0], ""
    revised = "(revised, " in text and "revised " not in text
    while shorter != text:  # nested parentheses, innermost first
        shorter, text = text, re.sub(r" \([^()]*\)", "", text)
    text = re.sub(r"^\w+ stage ", "", text).replace(" for the stages after it", " for the later stages")
    if revised:  # after the stage's own figure: before the later stages', where there are any
        figure_end = text.find(", then ") if ", then " in text else len(text)
        text = f"{text[:figure_end]}, revised{text[figure_end:]}"
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
