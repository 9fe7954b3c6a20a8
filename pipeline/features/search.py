"""The option search's candidates as they are compiled (or taken from the compile cache), verified
against eager on every case and timed: those that passed, those dropped, and each one's Trial.
tune.py decides which candidates to compile and which passed candidate to keep; this module does
the compiling, verifying and timing it asks for (side by side: parallel.py; rounds: rounds.py).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CompileError, ExportError, VerificationError
from ..services import contention, writable
from ..services.cache import Cache
from ..services.progress import StepClock, check_stop, estimate, say, step
from ..services.wording import figure, part_only
from ..stages.compile import Compiled, CompilePlan, compile_model
from ..stages.export import Exported
from ..stages.verify import open_runner, verify_model
from . import parallel, payback, rounds
from .candidates import Skipped
from .outlook import INSTALL_LEFT, INSTALL_S, VERIFYING, Outlook
from .payback import Budget


@dataclass(frozen=True)
class Trial:
    name: str
    options: dict
    passed: bool
    median_ms: float | None  # the median of its rounds' medians
    from_cache: bool
    problem: str = ""
    rounds_ms: tuple[float, ...] = ()  # each timing round's median, in round order
    spread_ms: tuple[float, float] | None = None  # the fastest and slowest round
    compile_s: float | None = None  # its fresh compile's seconds (None: from the cache, or not compiled)
    # how many of the cores other processes kept busy while it was timed (None: could not tell): a
    # figure timed under load is that load's, and the report says so beside it
    others_cores: float | None = None


FROM_CACHE = " (compiled earlier, from the build cache)"
FIRST_VERIFY = part_only("the first candidate's verification") + "from its cases so far"
LONE_ROUND_S, LONE_TIMING = 1.0, "its one round of timing, then the chosen one's install"
LONE_CAVEAT = "a rough figure for the report: make bench measures the wheel"


def timed_calls(compiled: dict[str, Compiled], weights_file: Path | None, inputs: tuple[torch.Tensor, ...]) -> dict:
    """One call of each candidate's .so, opened as the wheel's load() opens it, by name."""
    calls = {}
    for name, one in compiled.items():
        runner = open_runner(one, weights_file)
        calls[name] = lambda runner=runner: runner.run(list(inputs))
    return calls


class Search:
    """The candidates as they are compiled and verified: those that passed, those dropped."""

    def __init__(
        self,
        exported: Exported,
        planned: list[tuple[str, CompilePlan]],
        weights_file: Path | None,
        work_dir: Path,
        store: Cache,
        budget: Budget,
        time_lone: bool = True,
    ) -> None:
        self.exported, self.planned, self.plans = exported, planned, dict(planned)
        self.weights_file, self.work_dir, self.store, self.budget = weights_file, work_dir, store, budget
        self.passed: dict[str, Compiled] = {}
        self.failed: dict[str, Trial] = {}
        # a lone candidate's one round, a rough figure for the report: a reproduce's rebuild, whose
        # report is thrown away, spent 14 s of a newcomer's on it (tune(time_lone=False))
        self.time_lone_candidate = time_lone
        self.compile_s: dict[str, float] = {}
        self.first_failure: VerificationError | None = None
        self.noise_s = 0.0
        self.order = [name for name, _ in planned]  # what the counters count: narrowed once chosen
        # the load, from the first compile on: a lone candidate's one round (0.2 s) is too short to measure
        # it, and H63's tiny model read "16 ms a call" (0.34 ms quiet) with no word of it
        self.since = contention.OthersBusy()

    def narrow(self, chosen: list[str]) -> None:
        """The candidates chosen after the first: the counters count those (a newcomer saw 1/4, then
        3/4, and no 2/4 or 4/4, where the budget and the noise had left two out)."""
        self.order = [self.order[0], *chosen]

    def count_likely(self, likely: list[str]) -> None:
        """Before the first compile: counted of the candidates the budget likely allows (``likely``,
        the fresh ones; those in the build cache cost no compile), as the compile line says. "1/4", then
        "2/3" and "3/3" once the budget left one out read as a counter going back (H62)."""
        self.narrow([name for name, plan in self.planned[1:] if name in likely or self.store.has(plan.key)])

    def from_cache(self, name: str) -> bool:
        return name in self.passed and self.passed[name].from_cache

    def counter(self, name: str) -> str:
        return f"{self.order.index(name) + 1}/{len(self.order)} {name}"

    def compile_and_verify(
        self, name: str, precompiled: parallel.Done | None = None, then_s: float | None = None
    ) -> None:
        """``then_s``: what the search has left after this candidate, where it is known: its
        verification's cases then revise the stage's figure (H62: "about 1s left" came before
        two verifications that ran 29 s past it)."""
        check_stop()  # an interrupt Python could not raise where it landed stops the search here at the latest
        index = [n for n, _ in self.planned].index(name)
        outcome = _compile_and_verify(
            self.exported,
            index,
            name,
            self.plans[name],
            self.counter(name),
            len(self.planned) == 1,
            self.weights_file,
            self.work_dir,
            self.store,
            self.budget,
            precompiled,
            then_s,
        )
        if isinstance(outcome, tuple):
            self.failed[name] = outcome[0]
            self.first_failure = self.first_failure or outcome[1]
        else:
            self.passed[name] = outcome
        if precompiled is not None:
            self.compile_s[name] = precompiled.seconds
        elif self.budget.last is not None and self.budget.last[0] == name:
            self.compile_s[name] = self.budget.last[1]

    def noise(self) -> rounds.Timed:
        """The spec's own options timed alone, in the search's rounds, before any candidate is compiled."""
        name = self.planned[0][0]
        doing = f"noise: {name} timed alone, before the candidates"  # short: a row of an 80-column terminal
        step(f"{doing}: warming up")
        started = time.perf_counter()
        timed = rounds.time_in_rounds(
            timed_calls({name: self.passed[name]}, self.weights_file, self.exported.example_inputs),
            self.exported.target.synchronize,
            doing=doing,
            part=rounds.NOISE,
        )[name]
        self.noise_s = time.perf_counter() - started
        # the setting said where it is read (a newcomer who set it saw it nowhere when nothing was noisy)
        anyway = (
            "; `[compile] search_when_noisy = true`: the candidates are compiled whatever the noise"
            if self.exported.spec_file.spec.compile.search_when_noisy
            else ""
        )
        busy = timed.busy()
        say(f"    noise: {name} timed alone: {timed.describe()}: {payback.needed_to_win(timed)}{busy}{anyway}")
        return timed

    def time_passed(
        self, noise: rounds.Timed | None, cost: payback.Cost
    ) -> tuple[dict[str, rounds.Timed], payback.Cost]:
        """Those that passed, timed together in interleaved rounds. Where only the spec's own options
        passed and were timed alone for the noise already, those rounds are their timing: timing
        them again would compare them with nothing (a stopped search spent 51 s on it)."""
        first = self.planned[0][0]
        if noise is not None and list(self.passed) == [first]:
            return {first: noise}, cost
        if len(self.planned) == 1:
            return (self.time_lone(first) if self.time_lone_candidate else {}), cost
        doing = f"timing {len(self.passed)} candidates in interleaved rounds"
        step(f"{doing}: warming up")
        # A newcomer saw spec-options timed twice, 132 ms then 138 ms, and nothing said which counts.
        alone = f"; {first}'s noise figure above was timed alone, before" if noise is not None else ""
        say(
            f"    the {len(self.passed)} candidates that passed, timed together in {rounds.ROUNDS} interleaved rounds "
            f"(the choice goes by these{alone}):"
        )
        if self.noise_s:  # the same rounds, for each candidate: a newcomer's unet had 41 s of them unestimated
            estimate(self.noise_s * len(self.passed), "the noise rounds' time, for each candidate")
        started = time.perf_counter()
        timed = rounds.time_in_rounds(
            timed_calls(self.passed, self.weights_file, self.exported.example_inputs),
            self.exported.target.synchronize,
            doing=doing,
            last=True,
        )
        estimate(INSTALL_S, INSTALL_LEFT)  # the choice is made: its install is what is left of the stage
        return timed, dataclasses.replace(cost, timing_s=time.perf_counter() - started)

    def time_lone(self, name: str) -> dict[str, rounds.Timed]:
        """A lone candidate's time (the options pinned), for the build's output: one round, as nothing is compared with
        it (five took 25 s of the unet's build). Not verified yet (the verify stage does that), so a
        .so that raises on the example inputs is left untimed, for the verify stage to report."""
        step(f"timing {name} in 1 round")
        # said as what runs: "nothing more to compile: the chosen one's install" read oddly beside it (H64)
        estimate(INSTALL_S + LONE_ROUND_S, LONE_TIMING)
        try:
            return rounds.time_in_rounds(
                timed_calls({name: self.passed[name]}, self.weights_file, self.exported.example_inputs),
                self.exported.target.synchronize,
                rounds=1,
                since=self.since,
            )
        except Exception as exc:  # noqa: BLE001 (the runner's own error: the verify stage names the case)
            say(f"    candidate {name}: not timed: it raised on the example inputs ({str(exc).splitlines()[0][:120]})")
            return {}
        finally:
            estimate(INSTALL_S, INSTALL_LEFT)

    def kept_alone(self, cost: payback.Cost, skipped: list[Skipped]) -> str:
        """Why the spec's own options are kept when no other candidate was there to time. Said whole:
        a lock keeps it, and a later build quoted "(the lines above say why)" of lines it never printed (H46)."""
        if cost.stopped:
            return "the search stopped on the noise before compiling a candidate"
        if self.failed:
            return f"no other candidate passed verification ({', '.join(self.failed)} dropped)"
        reasons: dict[str, list[str]] = {}
        for skip in skipped:  # each reason's first clause: the figures stay in the lines and the report
            reasons.setdefault(re.split(r": | \(", skip.stable_reason, maxsplit=1)[0], []).append(skip.name)
        said = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items())
        return f"no other candidate was compiled ({said})" if said else "no other candidate was compiled"

    def compile_candidates(self, names: list[str], workers: int, outlook: Outlook, cost: payback.Cost) -> payback.Cost:
        """Compile the fresh ones side by side where there are cores for it, then verify each."""
        fresh = [name for name in names if not self.store.has(self.plans[name].key)]
        done: dict[str, parallel.Done] = {}
        started = time.perf_counter()
        if workers > 1 and len(fresh) > 1:
            # "in turn": a newcomer's three named beside "2 at a time" could not tell which two ran
            at_once = min(workers, len(fresh))
            turn = ", in this order" if len(fresh) > at_once else ""
            step(f"{', '.join(self.counter(n) for n in fresh)}: compiling, {at_once} at a time{turn}")
            jobs = [(name, self.plans[name], self.trial_work(name)) for name in fresh]
            for name, _, work in jobs:
                shutil.rmtree(work, ignore_errors=True)
                self.plans[name].compile_dir.mkdir(parents=True, exist_ok=True)

            def finished(left: dict[str, float]) -> None:  # H46: three named for 3m48s while max-autotune ran alone
                step(f"{', '.join(self.counter(n) for n in left)}: compiling, the others compiled")
                outlook.compiling(left, names)

            others = contention.OthersBusy()
            done = parallel.compile_all(self.exported, jobs, self.store.directory, at_once, finished)
            cost = dataclasses.replace(cost, compile_others_cores=others.cores())
            for name in fresh:
                self.budget.spent(name, done[name].seconds)
        wall_s = time.perf_counter() - started
        for index, name in enumerate(names):
            verifying = time.perf_counter()
            self.compile_and_verify(name, done.get(name), outlook.left_s(names[index + 1 :], compiled=bool(done)))
            if done:  # compiled before: this was its verification, which revises the others' (H62: 10x the first's)
                outlook.verified(time.perf_counter() - verifying)
            outlook.after(names[index + 1 :], compiled=bool(done))  # side by side: all compiled already
        spent = sum(self.compile_s.get(name, 0.0) for name in fresh)
        # one after the other, compiled here, where there were no cores (or candidates) to share
        in_turn_s = time.perf_counter() - started - wall_s
        if not done:
            wall_s = spent
        return dataclasses.replace(
            cost,
            compiled=len(fresh),
            compile_s=spent,
            compile_wall_s=wall_s,
            verify_s=max(0.0, in_turn_s - (0.0 if done else spent)),
            noise_s=self.noise_s,
            workers=min(workers, max(1, len(fresh))),
        )

    def trial_work(self, name: str) -> Path:
        return self.work_dir / "candidates" / name

    def trials(
        self, timed: dict[str, rounds.Timed], shown: bool, noise: rounds.Timed | None = None
    ) -> tuple[Trial, ...]:
        """Every candidate compiled, in the planned order, each one's line said."""
        out = []
        for name, plan in self.planned:
            if name in self.passed and name in timed:
                t, cached = timed[name], self.passed[name].from_cache
                busy = None if t.others_cores is None else round(t.others_cores, 2)
                # unrounded: the choice is made on them
                out.append(
                    Trial(
                        name,
                        plan.options,
                        True,
                        t.median_ms,
                        cached,
                        rounds_ms=t.rounds_ms,
                        spread_ms=(t.low_ms, t.high_ms),
                        compile_s=self.compile_s.get(name),
                        others_cores=busy,
                    )
                )
                # a lone candidate: nothing to compare, and one round on a busy machine read like the model's latency
                lone = f"{figure(t.median_ms)} ms a call, one round here ({LONE_CAVEAT})"
                line = t.describe() if shown else lone + contention.lone(busy, t.threads)
                if t is not noise:  # the noise rounds as its timing: their line said it already
                    # where its .so came from said first: a trailing "(cached)" read as a cached timing
                    say(f"    candidate {name}{FROM_CACHE if cached else ''}: {line}")
            elif name in self.passed:  # a lone candidate that raised while timed: the verify stage says why
                out.append(Trial(name, plan.options, True, None, self.passed[name].from_cache))
            elif name in self.failed:
                out.append(self.failed[name])
        return tuple(out)


def _error_kept(folder: Path, exc: CompileError | ExportError) -> Path | None:
    """A dropped candidate's error, message and hint, written to its work folder (None where it cannot be)."""
    path = folder / "compile-error.txt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(exc.message + (f"\nhint: {exc.hint}" if exc.hint else "") + "\n")
    except OSError:
        return None
    return path


def _compile_and_verify(
    exported: Exported,
    index: int,
    name: str,
    plan: CompilePlan,
    counter: str,
    alone: bool,
    weights_file: Path | None,
    work_dir: Path,
    store: Cache,
    budget: Budget,
    precompiled: parallel.Done | None = None,
    then_s: float | None = None,
) -> Compiled | tuple[Trial, VerificationError | None]:
    """The candidate compiled and verified, or (the Trial saying why it was dropped, its
    VerificationError or None): that error is the build's message when every candidate fails.
    ``precompiled``: a worker compiled it into the cache (parallel.py); it is taken from there.
    ``then_s``: what the search has left after it, where known (Search.compile_and_verify)."""
    trial_work = work_dir / "candidates" / name
    try:
        if precompiled is not None:
            if precompiled.problem:
                raise CompileError(precompiled.problem, "")
            # The worker's compile, as the cache holds it (read even with --no-cache: it is this build's).
            compiled = dataclasses.replace(
                compile_model(exported, plan, trial_work, Cache(store.directory)), from_cache=False
            )
        else:
            plan.compile_dir.mkdir(parents=True, exist_ok=True)  # made here: gone after a failure, it was removed
            compiled = _compile(exported, name, plan, counter, trial_work, store, budget)
    except (CompileError, ExportError) as exc:
        if full := writable.disk_full(exc.message):  # the machine's, not the candidate's (H40: "C++ compile error")
            raise full from exc
        if gone := writable.removed_meanwhile(plan.compile_dir):  # not the candidate's either (H61)
            raise gone from exc
        if index == 0:  # the spec's own options: their failure is the build's
            raise
        # the error whole, where the line can name it: its first line alone ("C++ compile error") pointed
        # nowhere, and the worker's compile left Inductor's log empty (H61)
        kept = _error_kept(trial_work, exc)
        whole = f"; the error in full: {kept}" if kept else ""
        say(f"    candidate {name}: did not compile, dropped ({exc.message.splitlines()[0][:120]}{whole})")
        return Trial(name, plan.options, False, None, False, exc.message.splitlines()[0]), None
    if alone:
        # A lone candidate (the options pinned: search = false, --no-search, a lock entry) has nothing
        # to be chosen over: the verify stage checks the .so the wheel ships, and verifying it here
        # too doubled the verification (70 s of the unet's build)
        return compiled
    try:
        # The first candidate's verification: the first compile's guess left it out, and a newcomer saw
        # "running past the estimate" while it ran; its cases give the figure (the rest's comes after it).
        stage, basis = ("compile", FIRST_VERIFY) if index == 0 else (None, StepClock.BASIS)
        if index != 0 and then_s is not None:
            stage, basis = "compile", VERIFYING
        # said from the first case on: a cached candidate read "verifying case 6/10" for 45 s, as if just compiled
        # short: a row cut at 80 columns lost its case count behind "(from the build cache)" (H43)
        cached = " (cached)" if compiled.from_cache else ""
        doing = f"{counter}{cached}: verifying "
        # the first's "pending" in place of the first compile's guess, which, run out, read "compile stage
        # running 4s past the estimate" to a newcomer while the stage was on time
        verify_model(exported, compiled, trial_work, weights_file, doing, stage, basis, then_s or 0.0, index == 0)
    except VerificationError as exc:
        say(f"    candidate {name}: fails verification, dropped ({exc.message.splitlines()[0][:160]})")
        return Trial(name, plan.options, False, None, compiled.from_cache, exc.message.splitlines()[0]), exc
    say(f"    candidate {name}{FROM_CACHE if compiled.from_cache else ''}: verified")
    return compiled


def _compile(
    exported: Exported, name: str, plan: CompilePlan, counter: str, trial_work: Path, store: Cache, budget: Budget
) -> Compiled:
    """One candidate compiled here (or taken from the cache), its fresh compile time counted."""
    # a cached one is not said as compiling, even for a moment (H43)
    step(f"{counter}: " + ("from the build cache" if store.has(plan.key) else "compiling"))
    shutil.rmtree(trial_work, ignore_errors=True)
    started = time.perf_counter()
    compiled = compile_model(exported, plan, trial_work, store)
    if not compiled.from_cache:
        budget.spent(name, time.perf_counter() - started)
    return compiled
