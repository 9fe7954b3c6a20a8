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
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..services.cache import Cache, first_compile_s, newest_reports
from ..services.progress import MEASURED_HERE, duration, estimate, expected_s, figure, ratio, say
from .first_guess import Guess
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

    @property
    def value(self) -> float:
        """Expected gain per compile (in units of a plain compile): the search's order."""
        return (self.gain - 1.0) / self.cost

    def source(self) -> str:
        return (
            f"measured {ratio(self.gain)} in an earlier build of this model"
            if self.measured
            else f"plausibly gains at most {ratio(self.gain)}"
        )


def earlier_search(cache_dir: Path, model: str, target: str) -> dict:
    """The compile_search of the newest build of this model and target in the build cache that
    timed its candidates ({} if none). Read even with --no-cache: it is only advice."""
    for report in newest_reports(cache_dir):
        search = report.get("compile_search") or {}
        if report.get("model") == model and report.get("target") == target and len(search.get("candidates", ())) > 1:
            return search
    return {}


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
    base = found.get("spec-options") or {}
    shared = compiled_side_by_side(earlier)
    out = []
    for name in names:
        prior, seen = PRIORS.get(name, UNKNOWN), found.get(name) or {}
        gain, cost, measured = prior.gain, prior.cost, False
        if seen.get("median_ms") and base.get("median_ms"):
            gain, measured = base["median_ms"] / seen["median_ms"], True
        if seen.get("compile_s") and base.get("compile_s") and not shared:
            cost = seen["compile_s"] / base["compile_s"]
        out.append(Expected(name, gain, max(cost, 0.05), measured))
    return sorted(out, key=lambda e: -e.value)


# A compile's time beside another, as a factor of its own alone (a lone compile's Inductor threads
# have both cores), where no earlier search here measured it: the median of four newcomers' unet
# searches on this project's 2-core machine, each pair side by side against the first alone
# (1.15, 1.25, 1.27 and 1.87, the last on a busy machine).
SIDE_BY_SIDE_SLOWDOWN = 1.26


def side_by_side_slowdown(cache_dir: Path) -> tuple[float, str]:
    """How much slower a compile runs beside another than alone here, and where that comes from:
    the newest earlier search in the build cache that compiled side by side (its candidates'
    compile_s over its first's, their prior costs taken out), else SIDE_BY_SIDE_SLOWDOWN."""
    for report in newest_reports(cache_dir):
        search = report.get("compile_search") or {}
        candidates = [c for c in search.get("candidates", ()) if isinstance(c, dict)]
        first_s = first_compile_s(report)
        if not first_s or not compiled_side_by_side(search):
            continue
        ratios = [
            c["compile_s"] / (first_s * COMPILE_COST.get(c["name"], 1.0)) for c in candidates[1:] if c.get("compile_s")
        ]
        return max(1.0, statistics.median(ratios)), "as an earlier search here measured"
    return SIDE_BY_SIDE_SLOWDOWN, "as measured on a 2-core machine"


def spread(noise: Timed) -> float:
    """How much faster than the spec's options a candidate must be to win beyond the noise."""
    return noise.high_ms / noise.low_ms if noise.low_ms > 0 else float("inf")


def payback_refusal(expected: Expected, baseline: str) -> str | None:
    """Why an earlier build's timing says the candidate cannot pay for its compile, or None."""
    if not expected.measured or expected.gain > 1.0:
        return None
    return (
        f"cannot pay back its compile: an earlier build of this model measured it {ratio(expected.gain)} "
        f"{baseline}'s speed (--no-cache and a fresh build folder forget that)"
    )


def noise_refusal(expected: Expected, noise: Timed, baseline: str) -> str | None:
    """Why the candidate cannot win beyond the measured noise (not compiled), or None."""
    needed = spread(noise)
    if expected.gain > needed:
        return None
    return (
        f"cannot win beyond the noise: {baseline}'s rounds spread {ratio(needed)} ({figure(noise.low_ms)}-"
        f"{figure(noise.high_ms)} ms), and it {expected.source()}"
    )


# As the manifest records a payback refusal, and a noise refusal: the spread differs run to run (the report has it).
NO_PAYBACK = "cannot pay back its compile: an earlier build of this model measured it no faster"
NOISY = "cannot win beyond the noise measured before compiling it (the build's report has the spread)"


def stopped_line(noise: Timed, baseline: str, refused: int) -> str:
    """Counted as the compile stage's first line counts ("4 candidates to try": the 3 after the first)."""
    which = f"any of the {refused} candidates" if refused > 1 else "the 1 candidate"
    return (
        f"    search stopped before compiling a candidate: {baseline} cannot be timed steadily enough here for "
        f"{which} after {baseline} to win (rounds {figure(noise.low_ms)} to "
        f"{figure(noise.high_ms)} ms, a {ratio(spread(noise))} spread); build on a quieter machine for a search, "
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
        return (
            f"over the search's compile budget (compile seconds, summed over the cores): {self.spent_s:.0f} s "
            f"spent{planned}, about {expected:.0f} s more "
            f"expected for it{times}, budget {figure(budget)} s ({source})"
        )


# A budget refusal as the manifest records it: its seconds differ run to run (the report has them).
OVER_BUDGET = "over the search's compile budget (the build's report has the seconds)"


def shorter(cache_dir: Path) -> str:
    """How to make the search shorter, naming this build's cache (--build-dir moves it: a newcomer's
    build said build/cache where its cache was another folder)."""
    return (
        "    to make it shorter: `build --no-search` or `[compile] search = false` in the spec (one compile, the "
        "spec's options), a smaller `[compile] search_budget_s` (fewer candidates), or build again unchanged "
        f"(compiles come from the build cache, {cache_dir})"
    )


def counted(fresh: list[str], first_fresh: bool, workers: int, given_s: float | None) -> list[str]:
    """The fresh candidates the search should compile: the first, then those the default budget
    leaves room for (Budget.refusal, in the first compile's units), each by its cost. A budget in
    seconds, or a first compile from the cache (nothing to measure it by), lets all run."""
    if not first_fresh or given_s:
        return list(fresh)
    room, names = BUDGET_FACTOR * (1 + workers) - COMPILE_COST.get(fresh[0], 1.0), fresh[:1]
    for name in fresh[1:]:
        if COMPILE_COST.get(name, 1.0) <= room:
            room, names = room - COMPILE_COST.get(name, 1.0), [*names, name]
    return names


def expected_rounds(fresh: list[str], first_fresh: bool, workers: int, given_s: float | None) -> float:
    """How many plain compiles' time the fresh candidates should take: those counted(), the first
    alone, then the others ``workers`` at a time (all side by side, where the first is cached), each
    by its cost (max-autotune's 3x: a newcomer's build with only it to compile was told one
    compile's time, 52 s, for 3m46s)."""
    return rounds_of(counted(fresh, first_fresh, workers, given_s), first_fresh, workers)


def rounds_of(names: list[str], first_fresh: bool, workers: int) -> float:
    """expected_rounds() of the candidates counted() gave."""
    costs = [COMPILE_COST.get(name, 1.0) for name in names]
    if not first_fresh:
        return max(costs, default=0.0) if len(costs) <= workers else sum(costs) / workers
    fits = costs[1:]
    later = max(fits, default=0.0) if len(fits) <= workers else sum(fits) / workers
    return costs[0] + later


MEASURED_WITH_ROUNDS = "from this build's compiles and noise rounds"


class Outlook:
    """About how long the search has left, from the time its first fresh compile took (times a
    candidate's cost for each fresh one still to come, shared among the cores compiling them)."""

    def __init__(self, planned: list[tuple[str, Any]], store: Cache, workers: int = 1) -> None:
        self.order = [name for name, _ in planned]
        self.fresh = {name for name, plan in planned if not store.has(plan.key)}
        self.cache_dir = store.directory
        self.workers = workers
        self.slowdown, self.slowdown_source = side_by_side_slowdown(store.directory)
        self.plain_s: float | None = None  # one plain compile, from the first's
        self.verify_s = 0.0  # one candidate's verification, from the first's
        self.round_s = 0.0  # one candidate's timing rounds, from the noise's (the spec's options alone)
        self.timed = 0  # how many candidates the timing rounds should time
        self.guessed = False

    def start(self, guess: Guess | None) -> None:
        """A model's first build here: the graph's guessed compile time is the estimate while the
        first compile runs (a newcomer's saw none for over a minute), until it is timed."""
        first = self.order[0]
        if guess is None or first not in self.fresh:
            return
        self.guessed = True
        # its scope said first: a newcomer read "about 6s left (the first compile: …)" as the stage's
        basis = guess.basis if len(self.order) == 1 else f"for the first compile only: {guess.basis}"
        estimate(guess.seconds * COMPILE_COST.get(first, 1.0), basis)

    def before_search(self, guess: Guess | None = None, budget_s: float | None = None) -> list[str]:
        """What the search will cost here, said before it starts: from the last build's compile
        stage where there was one, else in compiles (the first one's time gives the estimate).
        ``budget_s``: the spec's search_budget_s (None: the default budget, in compiles)."""
        if len(self.order) < 2 or not self.fresh:
            return []
        fresh, first_fresh = [n for n in self.order if n in self.fresh], self.order[0] in self.fresh
        compiles = counted(fresh, first_fresh, self.workers, budget_s)
        rounds = rounds_of(compiles, first_fresh, self.workers)
        # side by side only where two or more compile at once (a newcomer's one fresh candidate read "2 at a time")
        at_once = min(self.workers, len(compiles[1:] if first_fresh else compiles))
        side = f", {at_once} at a time" if at_once > 1 else ""
        # what the compiles' time counts: a first candidate from the cache is not among them, and a
        # costlier one (max-autotune, alone in a newcomer's build) counts as several compiles; one
        # the budget leaves out is not named (a newcomer read "counting max-autotune" in a build
        # whose budget had no room for it)
        first = "the first, then " if first_fresh else ""
        costly = [f"{n} as {ratio(COMPILE_COST[n])} a compile" for n in compiles if n in COMPILE_COST]
        room = f"{first}the candidates its budget leaves room for{side}" + (
            f", counting {', '.join(costly)}" if costly else ""
        )
        # said before, not only once the first compile is timed: a newcomer read "4 candidates",
        # then saw max-autotune dropped by the budget 50 s later
        beyond = [f"{n} ({ratio(COMPILE_COST.get(n, 1.0))} a compile)" for n in fresh if n not in compiles]
        if beyond:
            room += f"; likely beyond it: {', '.join(beyond)}"
        # named: "3 more from the cache" here and "2 more" in the summary (which counts beyond
        # spec-options) read to a newcomer as two different counts
        cached = [n for n in self.order if n not in self.fresh]
        what = (
            f"    search: {len(self.fresh)} candidate(s) to compile and verify"
            + (f" (and {', '.join(cached)} from the build cache, to verify)" if cached else "")
            + " as its budget allows, then all timed together"
        )
        # Three lines, the time first: said as one, the line ran to 500 characters (a newcomer's note)
        rest = (
            "    the first compile's time, measured now, gives the rest's; the search may stop after it where the "
            "machine is too noisy for a candidate to win"
        )
        last = expected_s("compile")
        if last:
            unit = "compiles'" if rounds != 1 else "compile's"
            how = f"    (the last build's compile stage, scaled to {figure(rounds)} plain {unit} time: {room})"
            return [f"{what}: about {duration(last)} on this machine", how, shorter(self.cache_dir)]
        # the rounds after the first run side by side, each compile slower beside another
        side_by_side = at_once > 1
        slowed = self.slowdown if side_by_side else 1.0
        times = 1 + (rounds - 1) * slowed if first_fresh else rounds * slowed  # the first alone, where it compiles
        slower = (
            f"; side by side, each about {ratio(self.slowdown)} as slow as alone, {self.slowdown_source}"
            if side_by_side
            else ""
        )
        if guess:  # a time, not a ratio the reader multiplies out (a newcomer's "2.26x one compile")
            how = (
                f"    ({ratio(times)} one full compile's time: {room}{slower}; a compile: about "
                f"{duration(guess.seconds)}, {guess.basis})"
            )
            return [
                f"{what}: about {duration(guess.seconds * times)} on this machine",
                how,
                rest,
                shorter(self.cache_dir),
            ]
        how = f"    ({room}{slower})"
        return [
            f"{what}: each is a full compile, so about {ratio(times)} one compile here",
            how,
            rest,
            shorter(self.cache_dir),
        ]

    def left_s(self, names: list[str], costs: dict[str, float] | None = None, compiled: bool = False) -> float | None:
        """What ``names`` should take: the fresh ones' compiles, side by side (none where they are
        ``compiled`` already), then each one's verification in turn, as the search runs them. Counted
        as one, compile and verify spread over the cores: a newcomer's estimate ran out while the
        candidates were verified one after the other (35 s past it, then none)."""
        if self.plain_s is None:
            return None
        costs = costs or {}
        compiles = sum(self.plain_s * costs.get(n, COMPILE_COST.get(n, 1.0)) for n in names if n in self.fresh)
        at_once = min(self.workers, len([n for n in names if n in self.fresh]))
        side_by_side = 0.0 if compiled else compiles / max(1, at_once) * (self.slowdown if at_once > 1 else 1.0)
        return side_by_side + self.verify_s * len(names) + self.round_s * self.timed

    def basis(self) -> str:
        """What left_s() rests on: the timing rounds counted too once the noise's were timed (left
        out, "about 10s left of compile" came 18 s before the stage ended)."""
        return MEASURED_WITH_ROUNDS if self.round_s else MEASURED_HERE

    def noise(self, seconds: float) -> None:
        """The spec's options were timed alone in ``seconds``: each candidate's rounds take about as long."""
        self.round_s = seconds

    def first(self, name: str, seconds: float, from_cache: bool, compile_s: float | None = None) -> None:
        """The spec's options are compiled and verified in ``seconds``, ``compile_s`` of them the
        compile: a fresh compile sets the estimate."""
        if not from_cache and name in self.fresh:
            compiled = seconds if compile_s is None else min(compile_s, seconds)
            self.plain_s = compiled / COMPILE_COST.get(name, 1.0)
            self.verify_s = seconds - compiled
        if self.guessed:  # timed now: the guess is done with (the noise rounds get no estimate)
            estimate(None)

    def after(self, rest: list[str], compiled: bool = False) -> None:
        """A candidate is verified: what the ones after it should take (none left: no estimate here;
        the timing rounds set their own, Search.time_passed); ``compiled``: all were, side by side."""
        left = self.left_s(rest, compiled=compiled) if rest else None
        estimate(left, None if left is None else self.basis())  # a basis alone would be said as a note

    def announce(
        self, first: str, seconds: float, chosen: list[str], skipped: list[str], costs: dict[str, float] | None = None
    ) -> None:
        """Once the search knows what it will compile: how long that should take."""
        self.timed = len(chosen) + 1 if chosen else 0
        left = self.left_s(chosen, costs)
        if left is None or first not in self.fresh:
            return
        over = f"; not compiled: {', '.join(skipped)}, over the search's compile budget" if skipped else ""
        if chosen or skipped:
            side = f", {min(self.workers, len(chosen))} at a time" if min(self.workers, len(chosen)) > 1 else ""
            # wall time, said as such beside the budget's summed seconds; the counters count from here on
            counted = f" (counted n/{len(chosen) + 1} from here)" if chosen else ""
            say(
                f"    candidate {first} took {duration(seconds)} to compile and verify: about {duration(left)} more, "
                f"wall time, for the other {len(chosen)} candidate(s){side}{counted} and the timing{over}"
            )
        # none to compile: the timing rounds set their own estimate
        estimate(left, self.basis()) if chosen else estimate(None)


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
    won: float | None = None  # the chosen candidate's speed-up over the spec's options (None: kept them)
