"""How long the option search should take, said before it starts and counted down as it runs
(the status line's figure for the compile stage): from the first compile's time, each candidate's
cost (payback.py's priors) and how much slower compiles run side by side; and what the default
budget counts (payback.Budget refuses by the same measure, once the first compile is timed).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from ..services.cache import Cache, first_compile_s, newest_reports
from ..services.contention import SAID_FROM_CORES
from ..services.progress import estimate, expected_s, say
from ..services.wording import FIRST_COMPILE, MEASURED_HERE, duration, figure, ratio, under_make
from .first_guess import Guess
from .payback import BUDGET_FACTOR, COMPILE_COST, compiled_side_by_side

# A compile's time beside another, as a factor of its own alone (a lone compile's Inductor threads
# have both cores), where no earlier search here measured it: the median of four newcomers' unet
# searches on this project's 2-core machine, each pair side by side against the first alone
# (1.15, 1.25, 1.27 and 1.87, the last on a busy machine).
SIDE_BY_SIDE_SLOWDOWN = 1.26


def side_by_side_slowdown(cache_dir: Path) -> tuple[float, str]:
    """How much slower a compile runs beside another than alone here, and where that comes from:
    the newest earlier search in the build cache that compiled side by side on a quiet machine (its
    candidates' compile_s over its first's, their prior costs taken out), else SIDE_BY_SIDE_SLOWDOWN.
    One whose compiles shared the cores with other processes is passed over (H47: a unet search beside
    a test suite measured 3.28x, and a ViT's next search was told so; its own took about 1x)."""
    for report in newest_reports(cache_dir):
        search = report.get("compile_search") or {}
        candidates = [c for c in search.get("candidates", ()) if isinstance(c, dict)]
        first_s = first_compile_s(report)
        loaded = ((search.get("cost") or {}).get("compile_others_cores") or 0.0) >= SAID_FROM_CORES
        if not first_s or not compiled_side_by_side(search) or loaded:
            continue
        ratios = [
            c["compile_s"] / (first_s * COMPILE_COST.get(c["name"], 1.0)) for c in candidates[1:] if c.get("compile_s")
        ]
        return max(1.0, statistics.median(ratios)), "as an earlier search here measured"
    return SIDE_BY_SIDE_SLOWDOWN, "as measured on a 2-core machine"


def shorter(cache_dir: Path, own_spec: bool = True) -> str:
    """How to make the search shorter, naming this build's cache (--build-dir moves it: a newcomer's
    build said build/cache where its cache was another folder)."""
    # through make, as make takes it: `build --no-search` read to a newcomer of `make build` as a make flag
    flag = '`ARGS="--no-search"`' if under_make() else "`build --no-search`"
    # a --hf build without --spec has no spec to put it in (H64): an override spec holds it
    spec = "in the spec" if own_spec else "in an override spec that --spec gives"
    # H62 followed it on a second build: 97 s of doctor and verify again, where an unchanged build took 3 s
    after = (
        "once this build is done, building again unchanged is quickest of all (its verified wheel comes from the "
        f"build cache, {cache_dir})"
    )
    if "--update-lock" in sys.argv[1:]:  # it asks for the search: --no-search beside it is refused (H68)
        return f"    to make it shorter: a smaller `[compile] search_budget_s` (fewer candidates); {after}"
    return (
        f"    to make it shorter: {flag} or `[compile] search = false` {spec} (one compile, the "
        f"spec's options), or a smaller `[compile] search_budget_s` (fewer candidates); {after}"
    )


def counted(
    fresh: list[str], first_fresh: bool, workers: int, given_s: float | None, plain_s: float | None = None
) -> list[str]:
    """The fresh candidates the search should compile: the first, then those the default budget
    leaves room for (Budget.refusal, in the first compile's units), each by its cost. A budget in
    seconds counts a guessed compile's ``plain_s``, as the search will count the measured one (H46:
    "about 1m16s" said under a 25 s budget that left room for no candidate); with no guess, or a first
    compile from the cache (nothing to measure it by), it lets all run."""
    if not first_fresh:
        return list(fresh)
    if given_s:
        if plain_s is None:
            return list(fresh)
        spent, kept = COMPILE_COST.get(fresh[0], 1.0) * plain_s, fresh[:1]
        for name in fresh[1:]:
            if spent + COMPILE_COST.get(name, 1.0) * plain_s <= given_s:
                spent, kept = spent + COMPILE_COST.get(name, 1.0) * plain_s, [*kept, name]
        return kept
    room, names = BUDGET_FACTOR * (1 + workers) - COMPILE_COST.get(fresh[0], 1.0), fresh[:1]
    for name in fresh[1:]:
        if COMPILE_COST.get(name, 1.0) <= room:
            room, names = room - COMPILE_COST.get(name, 1.0), [*names, name]
    return names


def rounds_of(names: list[str], first_fresh: bool, workers: int) -> float:
    """How many plain compiles' time the candidates counted() gave should take: the first alone,
    then the others ``workers`` at a time (all side by side, where the first is cached), each by its
    cost (max-autotune's 3x: a newcomer's build with only it to compile was told one compile's
    time, 52 s, for 3m46s)."""
    costs = [COMPILE_COST.get(name, 1.0) for name in names]
    if not first_fresh:
        return max(costs, default=0.0) if len(costs) <= workers else sum(costs) / workers
    fits = costs[1:]
    later = max(fits, default=0.0) if len(fits) <= workers else sum(fits) / workers
    return costs[0] + later


MEASURED_WITH_ROUNDS = "from this build's compiles and noise rounds"
# a candidate's verification under way: its cases, then the others and the timing rounds as counted before
VERIFYING = "from this candidate's cases so far, then the rest as this build measured it"
EARLIER_COMPILES, AND_ROUNDS = "from earlier builds' compiles", " and this build's noise rounds"
INSTALL_S, INSTALL_LEFT = 2.0, "nothing more to compile: the chosen one's install"
OVERRUN_MORE = 0.2  # a compile past its estimate: this much of its time so far, still to come


class Outlook:
    """About how long the search has left, from the time its first fresh compile took (times a
    candidate's cost for each fresh one still to come, shared among the cores compiling them)."""

    def __init__(self, planned: list[tuple[str, Any]], store: Cache, workers: int = 1, own_spec: bool = True) -> None:
        self.order = [name for name, _ in planned]
        self.own_spec = own_spec  # a spec file of the user's (not a --hf build's made from its folder alone)
        self.fresh = {name for name, plan in planned if not store.has(plan.key)}
        self.cache_dir = store.directory
        self.workers = workers
        self.slowdown, self.slowdown_source = side_by_side_slowdown(store.directory)
        self.plain_s: float | None = None  # one plain compile, from the first's
        # where the first is from the cache, what plain_s came from (earlier builds, or the graph's guess)
        self.plain_basis = ""
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
        basis = guess.basis if len(self.order) == 1 else f"{FIRST_COMPILE}{guess.basis}"
        estimate(guess.seconds * COMPILE_COST.get(first, 1.0), basis)

    def before_search(self, guess: Guess | None, compiles: list[str]) -> list[str]:
        """What the search will cost here, said before it starts: from the last build's compile
        stage where there was one, else in compiles (the first one's time gives the estimate).
        ``compiles``: the fresh candidates its budget likely lets compile (tune.likely_compiled)."""
        if len(self.order) < 2:
            return []
        if not self.fresh:  # all from the build cache: said too (H59: such a search began without a word)
            return [
                f"    search: {len(self.order)} candidates, all from the build cache ({', '.join(self.order)}): "
                "nothing to compile; each is verified, then all timed together",
                f"    the search may stop once {self.order[0]} is timed, where the machine is too noisy for a "
                "candidate to win",
            ]
        fresh, first_fresh = [n for n in self.order if n in self.fresh], self.order[0] in self.fresh
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
        if first_fresh and len(compiles) == 1:  # H47: "the first, then the candidates …" with room for none
            room = "the first only, its budget leaving room for no other"
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
            # counted apart from those it likely leaves out (H47: "4 … as its budget allows", then 3 beyond it)
            + (f", of which its budget likely allows {len(compiles)}" if beyond else " as its budget allows")
            + ", then all timed together"
        )
        # Three lines, the time first: said as one, the line ran to 500 characters (a newcomer's note)
        # a first candidate from the build cache has no compile to time (H44 read the promise anyway)
        rest = (
            "    the first compile's time, measured now, gives the rest's; the search may stop after it where the "
            "machine is too noisy for a candidate to win"
            if first_fresh
            else f"    {self.order[0]} comes from the build cache; the search may stop once it is timed, where the "
            "machine is too noisy for a candidate to win"
        )
        last = expected_s("compile")
        if not first_fresh:  # no first compile to time here: the earlier builds' plain compile, or the guess
            # (H45: a max-autotune compile, the others from the cache, had no figure for 3m33s, with only a guess)
            if last and rounds:
                self.plain_s, self.plain_basis = last / rounds, EARLIER_COMPILES
            elif guess:
                self.plain_s, self.plain_basis = guess.seconds, guess.basis
        if last:
            unit = "compiles'" if rounds != 1 else "compile's"
            how = f"    (earlier builds' compile stage, scaled to {figure(rounds)} plain {unit} time: {room})"
            # the caveat too: a noise-stopped search after "about 4m04s" with no word that it may stop (H58)
            return [
                f"{what}: about {duration(last)} on this machine",
                how,
                rest,
                shorter(self.cache_dir, self.own_spec),
            ]
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
                shorter(self.cache_dir, self.own_spec),
            ]
        how = f"    ({room}{slower})"
        return [
            f"{what}: each is a full compile, so about {ratio(times)} one compile here",
            how,
            rest,
            shorter(self.cache_dir, self.own_spec),
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
        if self.plain_basis:  # nothing compiled here to measure: "this build's compiles" was false
            return self.plain_basis + (AND_ROUNDS if self.round_s else "")
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
        elif self.plain_s is not None:  # from the cache: its verification, with the earlier builds' compile
            self.verify_s = seconds
        # done with: the guess, or its verification's figure (H43: "the first candidate's verification
        # running 39s past its estimate" stayed through the noise rounds); the noise rounds get none.
        # A lone candidate has only its install left: with no figure, the earlier builds' whole stage
        # came back for a moment ("about 58s left of the build" just before "compile done", H49)
        if len(self.order) == 1:
            estimate(INSTALL_S, INSTALL_LEFT)
        else:
            estimate(None)

    def verified(self, seconds: float) -> None:
        """A candidate compiled before was verified in ``seconds``: the others' verification is
        counted as the slowest so far, the first's included. Under load a newcomer's took 25 s each
        against the first's 2 s, and the stage ran 29 s past "about 1s left" (H62)."""
        self.verify_s = max(self.verify_s, seconds)

    def compiling(self, left: dict[str, float], names: list[str]) -> None:
        """Side by side, some compiled: what is left is the longest of those still to finish (``left``:
        each with the seconds it has run), by its own estimate less that time, then every candidate's
        verification and the timing rounds (H46: max-autotune ran alone 3m48s, the row 2m29s past a
        figure made for the pair)."""
        if self.plain_s is None:
            return
        # one past its own estimate is given a fifth of its time so far more, not none: "about 1s left
        # (revised)" came 30 s before a compile that had overrun ended (H63)
        own = max(
            max(self.plain_s * COMPILE_COST.get(name, 1.0) - ran_s, OVERRUN_MORE * ran_s)
            for name, ran_s in left.items()
        )
        estimate(max(0.0, own) + self.verify_s * len(names) + self.round_s * self.timed, self.basis())

    def after(self, rest: list[str], compiled: bool = False) -> None:
        """A candidate is verified: what the ones after it should take, then the timing rounds (none
        left: the rounds alone, until Search.time_passed sets their own; with no figure between, the
        row showed the earlier build's "running 16s past its estimate" for a moment, H42);
        ``compiled``: all were, side by side."""
        left = self.left_s(rest, compiled=compiled) if rest or self.round_s else None
        estimate(left, None if left is None else self.basis())  # a basis alone would be said as a note

    def announce(
        self,
        first: str,
        seconds: float,
        chosen: list[str],
        skipped: list[str],
        costs: dict[str, float] | None = None,
        others: int = 0,
        counted_before: int | None = None,
    ) -> None:
        """Once the search knows what it will compile: how long that should take. ``skipped``: those
        over the budget; ``others``: how many more it refused for other reasons (said above);
        ``counted_before``: what the first's counter counted, where the count changes said why."""
        self.timed = len(chosen) + 1 if chosen else 0
        left = self.left_s(chosen, costs)
        if not chosen:  # only the chosen one's install is left: a whole search's figure stayed (H43: 3m39s for 15 s)
            estimate(INSTALL_S, INSTALL_LEFT)
        elif left is not None:  # the first from the cache too: the earlier builds' compile gives the figure (H43)
            estimate(left, self.basis())
        if left is None or first not in self.fresh:
            return
        over = f"; not compiled: {', '.join(skipped)}, over the search's compile budget" if skipped else ""
        if chosen or skipped:
            side = f", {min(self.workers, len(chosen))} at a time" if min(self.workers, len(chosen)) > 1 else ""
            # wall time, said as such beside the budget's summed seconds; each named with the counter it has
            # from here on ("counted n/3 from here" was cryptic to a newcomer), and why that is of fewer
            # than the first's ("1/4", then "2/3" read to a newcomer as a candidate gone without a word)
            total = len(chosen) + 1
            recount = f"; {', '.join(skipped)} left out, over the search's compile budget, so counted of {total}"
            counters = ", ".join(f"{n}/{total} {name}" for n, name in enumerate(chosen, 2))
            changed = skipped and total != counted_before  # the likely count held: nothing to explain
            counted = f" ({counters}{recount if changed else ''})" if chosen else ""
            took = f"    candidate {first} took {duration(seconds)} to compile and verify: "
            if chosen:
                say(
                    f"{took}about {duration(left)} more, wall time, for the other {len(chosen)} candidate(s)"
                    f"{counted}{side} and the timing"
                )
            else:  # "about 0s more … for the other 0 candidate(s)" read to a newcomer as a glitch
                # the others, refused for other reasons on the lines above, said as such: "not compiled:
                # max-autotune" alone read as if it were the only one left out
                said = "; the others not tried, as the lines above say" if others else ""
                say(f"{took}no other candidate to compile{over}{said}")
