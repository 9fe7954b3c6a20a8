"""What the option search may spend, and on what (issue 44): a search that pays for itself.

Timing noise decides first. The spec's own options are compiled (the build needs them anyway)
and timed alone in the search's rounds before any candidate is compiled: a candidate replaces
them only when its slowest round beats their fastest (rounds.py), so it must be faster by more
than their spread (slowest round / fastest). A candidate that could not plausibly gain that
much cannot win here, and is not compiled; when none can, the search stops.

Then value for compile time: each candidate has a prior (the speed-up it plausibly gives at
best, and its compile time against a plain compile's), replaced by what the newest earlier
build of this model and target measured where its report in the build cache has it. The
candidates are compiled in the order of expected gain per compile second, while the budget
lasts: by default the first compile's time on each core the build may use, since the
candidates compile side by side (parallel.py).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..services.cache import newest_reports
from ..services.wording import figure, ratio
from .rounds import Timed


@dataclass(frozen=True)
class Prior:
    gain: float  # the speed-up over the spec's options it plausibly gives at best
    cost: float  # its compile time against a plain compile's


# Where nothing was measured: what these options gave on this project's models at best
# (docs/performance.md; freezing up to 1.3x on convolution nets, bfloat16 about 2x on AMX).
PRIORS = {
    "freezing": Prior(1.3, 1.0),
    "freezing+channels-last": Prior(1.3, 1.0),
    "max-autotune": Prior(1.2, 3.0),
    "bf16-autocast": Prior(2.0, 1.2),
}
UNKNOWN = Prior(1.2, 1.0)
COMPILE_COST = {name: prior.cost for name, prior in PRIORS.items() if prior.cost != 1.0}
# The default budget: the first compile's time, BUDGET_FACTOR times, on each core the search compiles on.
BUDGET_FACTOR = 1.0


def cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the machine's)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Expected:
    name: str
    gain: float
    cost: float
    measured: bool  # from an earlier build's report, not the prior
    threads: int | None = None  # what that build's rounds ran on, where measured and recorded

    @property
    def value(self) -> float:
        """Expected gain per compile (in units of a plain compile): the search's order."""
        return (self.gain - 1.0) / self.cost

    def source(self, baseline: str) -> str:
        """Where its expected gain comes from ("it measured 1.05x in an earlier build" left out
        against what, and on how many threads: H52's 1-thread search quoted a 2-thread build)."""
        if not self.measured:
            return f"it plausibly gains at most {ratio(self.gain)}"
        on = f" (its rounds on {self.threads} thread{'s' if self.threads != 1 else ''})" if self.threads else ""
        return f"an earlier build of this model{on} measured it {ratio(self.gain)} faster than {baseline}"


def earlier_search(cache_dir: Path, model: str, target: str) -> dict:
    """What the build cache's reports of this model and target measured of each candidate: its
    newest timing, beside the spec's options' in that same build ({} if none). Merged over the
    reports: a build that did not time a candidate (refused as unable to pay back, the search
    stopped on the noise) replaced the report, and the next build compiled that loser again. Read
    even with --no-cache: it is only advice."""
    merged: dict[str, dict] = {}
    for report in newest_reports(cache_dir):
        search = report.get("compile_search") or {}
        if report.get("model") != model or report.get("target") != target:
            continue
        found = {c["name"]: c for c in search.get("candidates", ()) if isinstance(c, dict) and c.get("name")}
        base, shared = found.get("spec-options") or {}, compiled_side_by_side(search)
        for name, seen in found.items():
            if name != "spec-options" and name not in merged and seen.get("median_ms"):
                merged[name] = {
                    **seen,
                    "base_median_ms": base.get("median_ms"),
                    "base_compile_s": base.get("compile_s"),
                    "shared": shared,
                    "threads": search.get("threads"),
                }
        for skip in search.get("not_tried", ()):  # what it did not time, as an earlier build had (carried forward)
            if isinstance(skip, dict) and isinstance(skip.get("earlier"), dict) and skip.get("name") not in merged:
                merged[skip["name"]] = skip["earlier"]
    return {"candidates": list(merged.values())} if merged else {}


def compiled_side_by_side(search: dict) -> bool:
    """Whether a search's candidates after the first were compiled beside each other (their
    compile_s is then the time each took sharing the cores, not its own)."""
    fresh = [c for c in search.get("candidates", ())[1:] if isinstance(c, dict) and c.get("compile_s")]
    return ((search.get("cost") or {}).get("workers") or 1) > 1 and len(fresh) > 1


def expectations(names: list[str], earlier: dict) -> list[Expected]:
    """Each candidate's expected gain and compile cost, best value first (ties keep their order).
    A compile time measured beside another compile is not taken as its cost: freezing's 107 s,
    compiled 2 at a time, against spec-options' 57 s alone, made it "1.87x" a compile."""
    found = {c["name"]: c for c in earlier.get("candidates", ())}
    base, shared = found.get("spec-options") or {}, compiled_side_by_side(earlier)
    out = []
    for name in names:
        prior, seen = PRIORS.get(name, UNKNOWN), found.get(name) or {}
        gain, cost, measured = prior.gain, prior.cost, False
        # against the spec's options of the build that timed it (earlier_search), else of this search
        base_ms, base_s = (
            seen.get("base_median_ms", base.get("median_ms")),
            seen.get("base_compile_s", base.get("compile_s")),
        )
        threads = None
        if seen.get("median_ms") and base_ms:
            gain, measured = base_ms / seen["median_ms"], True
            threads = seen.get("threads") if isinstance(seen.get("threads"), int) else None
        if seen.get("compile_s") and base_s and not seen.get("shared", shared):
            cost = seen["compile_s"] / base_s
        out.append(Expected(name, gain, max(cost, 0.05), measured, threads))
    return sorted(out, key=lambda e: -e.value)


def spread(noise: Timed) -> float:
    """How much faster than the spec's options a candidate must be to win beyond the noise."""
    return noise.high_ms / noise.low_ms if noise.low_ms > 0 else float("inf")


def needed_to_win(noise: Timed) -> str:
    """What a candidate must beat, as the noise line says it: "must be 1x faster" read as nonsense
    to a newcomer whose rounds agreed within half a percent."""
    needed = spread(noise)
    if ratio(needed) != "1x":
        return f"a candidate must be {ratio(needed)} faster to win beyond it"
    return "its rounds agree within 0.5%: a candidate wins whose slowest round is faster than its fastest"


def payback_refusal(expected: Expected, baseline: str) -> str | None:
    """Why an earlier build's timing says the candidate cannot pay for its compile, or None."""
    if not expected.measured or expected.gain > 1.0:
        return None
    return (
        f"cannot pay back its compile: an earlier build of this model measured it {ratio(expected.gain)} "
        f"{baseline}'s speed (kept in the build cache's reports, read under --no-cache too; another "
        "--build-dir forgets it)"
    )


def noise_refusal(expected: Expected, noise: Timed, baseline: str) -> str | None:
    """Why the candidate cannot win beyond the measured noise (not compiled), or None."""
    needed = spread(noise)
    if expected.gain > needed:
        return None
    return (
        f"cannot win beyond the noise: {baseline}'s rounds spread {ratio(needed)} ({figure(noise.low_ms)}-"
        f"{figure(noise.high_ms)} ms), and {expected.source(baseline)}"
    )


def undecided(timed: dict[str, Timed], baseline: str, lockable: bool = True) -> str | None:
    """Why the timing rounds could not tell the candidates apart, or None: the spec's options kept
    because their own rounds spread more than any candidate timed plausibly gains at best. A
    newcomer's search timed under a load that came mid-search (rounds 284 to 447 ms, 112 ms alone
    just before) kept them and locked that choice for every later build. ``lockable``: the spec has
    a lock file (a --hf build's own spec has none, and "nothing is locked" read as if it could)."""
    if baseline not in timed or len(timed) < 2:
        return None
    needed, best = spread(timed[baseline]), max(PRIORS.get(n, UNKNOWN).gain for n in timed if n != baseline)
    if needed < best:
        return None
    # every candidate slower in its fastest round than the spec's options in their slowest: the rounds
    # told them apart (a newcomer's ViT: 0.299 ms and up against 0.138-0.196 ms, yet "too noisy")
    if all(one.low_ms > timed[baseline].high_ms for name, one in timed.items() if name != baseline):
        return None
    # no claim of what a candidate gains: "more than any plausibly gains (1.3x)" beside a median 1.39x
    # lower read to a newcomer as a contradiction; in rounds this wide, no median can be trusted
    return (
        f"    too noisy to decide: {baseline}'s own rounds spread {ratio(needed)} ({figure(timed[baseline].low_ms)}-"
        f"{figure(timed[baseline].high_ms)} ms), wider than the {ratio(best)} a candidate here is expected to gain at "
        f"best, so no median here can be trusted{timed[baseline].busy()}; "
        f"{baseline} is kept"
        + (", and this build locks nothing" if lockable else "")
        # how to search again: an unchanged build reuses this one from the build cache (H68)
        + "; on a quieter machine, a build with --no-cache searches again"
    )


# As the manifest records a payback refusal, and a noise refusal: the spread differs run to run (the report has it).
NO_PAYBACK = "cannot pay back its compile: an earlier build of this model measured it no faster"
NOISY = "cannot win beyond the noise measured before the compiles (the build's report has the spread)"


def stopped_line(noise: Timed, baseline: str, refused: int, best: Expected | None = None) -> str:
    """Counted as the compile stage's first line counts ("4 candidates to try": the 3 after the first).
    ``best``: the candidate expected to gain most, whose gain is the spread a search needs."""
    which = f"any of the {refused} candidates" if refused > 1 else "the 1 candidate"
    # the busy clause once, on the noise line just above: both lines carried its 250 characters
    why = ", the noise line above says why" if noise.busy() else ""
    # the bar named: a newcomer's spreads narrowed from 2.25x to 1.34x, with no word of how close that was (H60)
    bar = (
        f": a spread under {ratio(best.gain)} (the most {best.name} is expected to gain) lets a candidate compile"
        if best is not None
        else ""
    )
    return (
        f"    search stopped before compiling a candidate: {baseline} cannot be timed steadily enough here for "
        f"{which} after {baseline} to win (rounds {figure(noise.low_ms)} to "
        f"{figure(noise.high_ms)} ms, a {ratio(spread(noise))} spread{why}){bar}; "
        "build on a quieter machine for a search (with --no-cache: an unchanged build reuses this one), "
        "or set `[compile] search_when_noisy = true` to compile them anyway"
    )


class Budget:
    """How much compiling the search may still do, measured on its own fresh compiles."""

    def __init__(self, given_s: float | None, workers: int = 1) -> None:
        self.given_s, self.workers, self.spent_s = given_s, workers, 0.0
        self.planned_s = 0.0  # the expected compiles of the candidates chosen before this one (select())
        self.plain_s: float | None = None
        self.last: tuple[str, float] | None = None  # the latest fresh compile: (its name, its seconds)

    def spent(self, name: str, seconds: float) -> None:
        self.spent_s, self.last = self.spent_s + seconds, (name, seconds)
        if self.plain_s is None:
            self.plain_s = seconds / COMPILE_COST.get(name, 1.0)

    def refusal(self, name: str, cost: float | None = None) -> str | None:
        """Why ``name`` is not compiled (it would take the search past its budget), or None."""
        if self.plain_s is None:  # nothing compiled fresh yet: nothing to predict from
            return None
        budget = self.given_s or BUDGET_FACTOR * self.plain_s * (1 + self.workers)
        factor = cost if cost is not None else COMPILE_COST.get(name, 1.0)
        expected = self.plain_s * factor
        if self.spent_s + self.planned_s + expected <= budget:
            return None
        source = (
            "[compile] search_budget_s"
            if self.given_s
            else f"the first compile's time, then {BUDGET_FACTOR:g}x it on each of {self.workers} core(s) for the "
            "candidates"
        )
        # Its factor said: a newcomer read "73 s more expected for it" beside a first compile of 62 s
        times = f" ({ratio(factor)} the first compile's time)" if round(factor, 2) != 1.0 else ""
        # Spent and planned apart: counted as one, a newcomer read "28 s spent" beside a line saying
        # the other candidate would take 19 s more, with only 9 s compiled so far.
        planned = (
            f", about {self.planned_s:.0f} s planned for the candidates chosen before it" if self.planned_s else ""
        )
        # The sum against the budget: "about 121 s more expected for it … budget 121 s" read as if it fit
        total = self.spent_s + self.planned_s + expected
        return (
            f"over the search's compile budget (compile seconds, summed over the cores): {self.spent_s:.0f} s "
            f"spent{planned} and about {expected:.0f} s more expected for it{times} come to about {total:.0f} s, "
            f"over its budget of {figure(budget)} s ({source})"
        )


# A budget refusal as the manifest records it: its seconds differ run to run (the report has them).
OVER_BUDGET = "over the search's compile budget (the build's report has the seconds)"


def select(
    expected: list[Expected], budget: Budget, store_has: Callable[[str], bool]
) -> tuple[list[Expected], list[tuple[Expected, str]]]:
    """The candidates to compile, best value first, and those the budget leaves out (with why);
    a cached one costs nothing. The budget is counted on expected compile times."""
    ahead, chosen, over = copy.copy(budget), [], []
    for one in expected:
        if store_has(one.name):
            chosen.append(one)
            continue
        refusal = ahead.refusal(one.name, one.cost)
        if refusal:
            over.append((one, refusal))
            continue
        chosen.append(one)
        if ahead.plain_s is not None:
            ahead.planned_s += ahead.plain_s * one.cost
    return chosen, over


@dataclass(frozen=True)
class Cost:
    """What the search cost and what it won: the build's summary and its report."""

    compiled: int = 0  # candidates compiled fresh, the spec's options aside
    compile_s: float = 0.0  # their compile seconds, summed over the cores
    compile_wall_s: float = 0.0  # the wall-clock time they took, side by side
    verify_s: float = 0.0  # verifying them, one after the other (a newcomer's unet: 63 s the summary left out)
    workers: int = 1
    noise_s: float = 0.0  # timing the spec's options alone, before any candidate
    timing_s: float = 0.0  # the rounds that timed the candidates against each other
    spread: float | None = None  # the spec's options' slowest round / fastest, before any candidate
    stopped: str = ""  # why the search stopped before compiling a candidate, if it did
    undecided: str = ""  # why its timing rounds could not tell the candidates apart, if they could not
    won: float | None = None  # the chosen candidate's speed-up over the spec's options (None: kept them)
    # how many of the cores other processes kept busy while the candidates compiled side by side (None:
    # not measured): a later search's slowdown figure passes over a loaded one (outlook.side_by_side_slowdown)
    compile_others_cores: float | None = None
