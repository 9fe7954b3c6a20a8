"""Timing compile candidates so that noise cannot choose between them (issue 30).

Whatever else runs on the machine (other builds, a CI runner's neighbours) slows the compiled
code by multiples, not fractions, and in bursts: timed one after another, the candidate that
happened to run in a quiet minute won. So every candidate is timed in the same rounds,
interleaved (each round runs them all, in an order rotated from round to round), and each
one's spread over those rounds is measured. A candidate replaces the spec's own options only
when it wins beyond that spread: its slowest round is faster than the spec's fastest one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..services import contention
from ..services.progress import check_stop, estimate, step
from ..services.wording import apart, figure, part_only, ratio

ROUNDS = 5
ROUND_RUNS, ROUND_SECONDS = 3, 0.2  # per candidate and round: at least this many calls and seconds
WARMUP_RUNS = 2
BUSY_SPREAD = 1.1  # rounds spread this much or more are said with what other processes took of the cores
# One round this many times as long as the next slowest stalled (a thread taken off its core for a
# while), and is left out of the range: a newcomer's BERT search stopped as a "1126x spread" on
# rounds of 0.117, 0.128, 0.132, 0.13 and 132 ms. Only one, and only of a full set of rounds: two
# or more slow rounds are the machine's noise, and count. Left out against the median instead, two
# stalled rounds of each candidate under a heavy load let a candidate "win 3.27x" that was 1.13x
# faster on a quiet machine (H63). Rounds over this many times the median that count are said as such:
# "0.398 ms [0.385-416]" read as a unit bug (H62).
STALL = 2.0


@dataclass(frozen=True)
class Timed:
    rounds_ms: tuple[float, ...]  # each round's median, in round order
    # how many of this process's cores other processes kept busy, on average, while the rounds ran
    # (services/contention.py; None where it could not tell), and the model's threads: what the
    # spread is said with
    others_cores: float | None = None
    threads: int = 1

    def busy(self) -> str:
        """What other processes did to the rounds, where they took half a core or more: the spread
        they caused (contention.said), or, where the rounds agree, that every one is slower
        (contention.steady): beside rounds that agree, "some calls take far longer" is false."""
        if self.high_ms < self.low_ms * BUSY_SPREAD:  # a steady load slows every round alike (H39: 180 ms, quiet 0.22)
            return contention.steady(self.others_cores, self.threads)
        return contention.said(self.others_cores, self.threads, ratio(self.high_ms / self.low_ms))

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds_ms)

    @property
    def low_ms(self) -> float:
        return min(self.rounds_ms)

    @property
    def stalled_ms(self) -> float | None:
        """The one round that stalled (STALL), left out of the range, or None."""
        if len(self.rounds_ms) < ROUNDS:
            return None
        *_, next_slowest, slowest = sorted(self.rounds_ms)
        return slowest if slowest > STALL * next_slowest else None

    @property
    def high_ms(self) -> float:
        """The slowest round, but for one that stalled: what the range, the spread and the choice use."""
        kept = sorted(self.rounds_ms)
        return kept[-2] if self.stalled_ms is not None else kept[-1]

    def far_ms(self) -> list[float]:
        """The rounds over STALL times the median that count in the range (all but a stalled one)."""
        stalled = self.stalled_ms
        return [ms for ms in self.rounds_ms if ms > STALL * self.median_ms and ms != stalled]

    def describe(self) -> str:
        shown = ", ".join(figure(ms) for ms in self.rounds_ms)
        stalled, far = self.stalled_ms, self.far_ms()
        left_out = (
            f"; the {figure(stalled)} ms round stalled, over {ratio(STALL)} the next slowest, "
            "and is left out of the range"
            if stalled is not None
            else ""
        )
        if far:
            rounds = " and ".join(figure(ms) for ms in far)
            these = "round is" if len(far) == 1 else "rounds are"
            left_out += (
                f"; the {rounds} ms {these} over {ratio(STALL)} the median (other work held the cores then), "
                "and count in the range"
            )
        return (
            f"{figure(self.median_ms)} ms [{figure(self.low_ms)}-{figure(self.high_ms)}] "
            f"over {len(self.rounds_ms)} rounds ({shown}{left_out})"
        )


def rotated(items: list, by: int) -> list:
    """``items`` starting at index ``by`` (mod their number): round r's order."""
    by %= len(items)
    return items[by:] + items[:by]


def _round_s(call_s: float) -> float:
    """A round's seconds for one candidate whose calls take ``call_s``: _round_median's loop."""
    return max(ROUND_RUNS * call_s, ROUND_SECONDS + call_s)


def _round_median(call: Callable[[], object], synchronize: Callable[[], object], until: float = 0.0) -> float:
    """The median call of a round: at least ROUND_RUNS calls and ROUND_SECONDS, and on to ``until``
    (a time.perf_counter()) where that is later."""
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < ROUND_RUNS or time.perf_counter() < max(started + ROUND_SECONDS, until):
        synchronize()
        t0 = time.perf_counter()
        call()
        synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


ROUNDS_SO_FAR = "from the timing rounds so far"
ROUNDS_FROM_WARMUP = "from the warm-up calls"
# the noise rounds' own figure, a part of the compile stage (H60: 31 s of them with no time left said)
NOISE = "the noise rounds"
NOISE_SO_FAR = part_only(NOISE) + ROUNDS_SO_FAR


def time_in_rounds(
    calls: dict[str, Callable[[], object]],
    synchronize: Callable[[], object] = lambda: None,
    rounds: int = ROUNDS,
    doing: str = "",
    last: bool = False,
    part: str | None = None,
    since: contention.OthersBusy | None = None,
) -> dict[str, Timed]:
    """``calls``: name -> a function running one call of that candidate. Every candidate runs in
    every round; round r starts at candidate r (mod their number), so none always follows another.
    ``doing``: the live status, said with the round running (``…: round 2/5``); ``last``: the rounds
    end their stage, whose time left they then give from the rounds so far (a newcomer's build,
    past the rounds' first estimate, said only how far past it); ``part``: the rounds are this part
    of their stage (``the noise rounds``), whose own figure they give (wording.part_only). Either way
    the first figure comes from the warm-up calls, on the machine as it is then. ``since``: the load
    is measured from then (a lone candidate's round alone is too short to measure it)."""
    names = list(calls)
    basis = part_only(part) if part else ""  # the figure's words: the part's, or the stage's own
    warm_s: dict[str, float] = {}
    for name in names:
        for _ in range(WARMUP_RUNS):
            synchronize()
            t0 = time.perf_counter()
            calls[name]()
            synchronize()
            warm_s[name] = time.perf_counter() - t0  # the last: a warm call, on the machine as it is now
    if last or part:  # H62: the noise rounds, timed alone and quiet (1.5 s), gave "about 1s left" of 58 s
        estimate(rounds * sum(_round_s(call_s) for call_s in warm_s.values()), basis + ROUNDS_FROM_WARMUP)
    medians: dict[str, list[float]] = {name: [] for name in names}
    started, others = time.perf_counter(), since or contention.OthersBusy()
    for index in range(rounds):
        if doing:
            step(f"{doing}: round {index + 1}/{rounds}")
        for name in rotated(names, index):
            check_stop()
            # a lone round goes on until the load can be measured, where it began too late for that
            until = since.measurable_at() if since is not None and rounds == 1 else 0.0
            medians[name].append(_round_median(calls[name], synchronize, until))
        if (last or part) and index < rounds - 1:  # after the last, the caller's figure (an estimate of 0
            # here read "finishing, at its revised estimate" just after "running 3s past" to a newcomer, H45)
            left = (time.perf_counter() - started) / (index + 1) * (rounds - index - 1)
            estimate(left, basis + ROUNDS_SO_FAR)
    others_cores = others.cores()
    threads = torch.get_num_threads()  # the OpenMP threads the calls ran on
    return {name: Timed(tuple(found), others_cores, threads) for name, found in medians.items()}


def _as_long(part: float) -> str:
    """``1.04x as long``; ``within 0.5% of it`` where the ratio rounds to 1x ("a median 1x as long",
    for 103 ms against 102, read to a newcomer as the same)."""
    said = ratio(part)
    return "within 0.5% of it" if said == "1x" else f"{said} as long"


LOWEST_TOO = "; it has the lowest median too"


def choose(timed: dict[str, Timed], baseline: str, medians_trusted: bool = True) -> tuple[str, str]:
    """(the candidate to ship, why). The baseline (the spec's own options) stays unless another
    candidate's slowest round beats its fastest; among those that do, the lowest median wins.
    ``medians_trusted``: False where the rounds are too noisy to decide (payback.undecided), and
    the baseline's median is not praised as the lowest."""
    if baseline not in timed:
        best = min(timed, key=lambda name: timed[name].median_ms)
        return best, f"the lowest median; the spec's own options ({baseline}) did not pass verification"
    base = timed[baseline]
    winners = [name for name, t in timed.items() if name != baseline and t.high_ms < base.low_ms]
    if not winners:
        # said where true: "no candidate is faster beyond the noise" undersold a freezing 2.5x slower
        lowest = LOWEST_TOO if medians_trusted and min(timed, key=lambda n: timed[n].median_ms) == baseline else ""
        return baseline, (
            f"no candidate is faster beyond the noise its rounds measured: none has its slowest round "
            f"under {baseline}'s fastest ({figure(base.low_ms)} ms){lowest}"
        )
    best = min(winners, key=lambda name: timed[name].median_ms)
    # one with a lower median that did not win, said: a newcomer read freezing at 80.2 ms lose to
    # freezing+channels-last at 89.3 ms with no word of why
    quicker = [n for n, t in timed.items() if n not in (baseline, *winners) and t.median_ms < timed[best].median_ms]
    passed_over = "".join(
        f"; {name}'s median was lower ({figure(timed[name].median_ms)} ms), but its slowest round "
        f"({figure(timed[name].high_ms)} ms) was not"
        for name in quicker
    )
    # another winner, said with how close it came: a newcomer's two builds locked freezing+channels-last
    # (69.7 ms) in one lock and freezing (68.3 ms) in another, each by a median 1% apart
    close = "".join(
        f"; {name} won too, with a median " + _as_long(timed[name].median_ms / timed[best].median_ms)
        for name in winners
        if name != best
    )
    slowest, fastest = apart(timed[best].high_ms, base.low_ms)
    return best, (
        f"its slowest round ({slowest} ms) is faster than {baseline}'s fastest "
        f"({fastest} ms), and its median is the lowest of those that are{close}{passed_over}"
    )
