"""Choosing compile options: compile and verify each candidate, then time those that pass together
(pipeline/features/rounds.py): the spec's own options stay unless another wins beyond the measured noise.
What the search may spend, and on which candidates, is payback.py's; the compiles side by side, parallel.py's.

The candidates, and those ruled out before compiling, are candidates.py's (with `[compile]
search = true`, the default; `search = false` pins the spec's options). Each is compiled (or
taken from the compile cache) and verified against eager on every case; a failing candidate is
dropped. Not compiled either: any candidate when the spec's own options, timed alone first, are
too noisy for it to win beyond the noise, and those a compile-time budget that scales with the
model leaves out (payback.py).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import targets
from ..errors import CompileError, ExportError, VerificationError
from ..services.cache import Cache
from ..services.progress import check_stop, expected_s, figure, ratio, say, step
from ..stages import constants
from ..stages.compile import Compiled, CompilePlan, compile_model, plan_compile, plan_in
from ..stages.export import Exported
from ..stages.verify import open_runner, verify_model
from . import first_guess, parallel, payback, rounds
from .candidates import Skipped, candidates
from .lock import Locked
from .payback import OVER_BUDGET, SHORTER, Budget, Outlook  # noqa: F401 (SHORTER, OVER_BUDGET: the search's, named here too)


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


@dataclass(frozen=True)
class Tuned:
    compiled: Compiled  # the chosen candidate, still in its trial folder
    chosen: str
    plan: CompilePlan  # the chosen candidate's
    trials: tuple[Trial, ...]
    skipped: tuple[Skipped, ...] = ()
    why: str = ""  # why the chosen candidate was chosen (pipeline/features/rounds.py)
    cost: payback.Cost = payback.Cost()  # what the search cost and won
    graph_ops: int | None = None  # the exported graph's size: a later first build's guess (first_guess.py)


def plans(
    exported: Exported, cxx_version: str, output_dir: Path, keep_debug: bool = False, locked: Locked | None = None
) -> tuple[list[tuple[str, CompilePlan]], list[Skipped]]:
    """Each candidate compiles in ``output_dir/.candidates/<name>``: a path that is the same in every
    build of this model version (the .so records where it was compiled, and wheels must be
    reproducible) and different for every candidate (a process cannot load two .so at one path).
    A lone candidate of a target whose .so must stay where it was compiled compiles in place."""
    found, skipped = candidates(exported, locked)
    in_place = len(found) == 1 and not exported.target.RELOCATABLE
    where = lambda name: output_dir if in_place else output_dir / ".candidates" / name  # noqa: E731
    return [
        (name, plan_compile(exported, cxx_version, where(name), overrides, keep_debug)) for name, overrides in found
    ], skipped


def final_plans(exported: Exported, planned: list[tuple[str, CompilePlan]], output_dir: Path) -> list[CompilePlan]:
    """The compiles install() may still need: on a target whose .so cannot move, the chosen
    candidate is compiled again at the output path."""
    if exported.target.RELOCATABLE:
        return []
    return [plan_in(exported, plan, output_dir) for _, plan in planned if plan.compile_dir != output_dir]


def timed_calls(compiled: dict[str, Compiled], weights_file: Path | None, inputs: tuple[torch.Tensor, ...]) -> dict:
    """One call of each candidate's .so, opened as the wheel's load() opens it, by name."""
    calls = {}
    for name, one in compiled.items():
        runner = open_runner(one, weights_file)
        calls[name] = lambda runner=runner: runner.run(list(inputs))
    return calls


def tune(
    exported: Exported,
    planned: list[tuple[str, CompilePlan]],
    skipped: list[Skipped],
    weights_file: Path | None,
    work_dir: Path,
    store: Cache,
) -> Tuned:
    """A line per candidate; the live status says what is being done now (``2/4 freezing: compiling``).
    The spec's own options are compiled, verified and timed alone first (the noise); the candidates
    that could win beyond it and that the budget allows are compiled side by side, then verified
    one at a time; those that pass are timed together, in interleaved rounds (rounds.py), and the
    spec's own options stay unless one wins beyond the spread measured in those rounds."""
    for skip in skipped:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    spec, skipped = exported.spec_file.spec, list(skipped)
    # Side by side where the target allows it: a forked worker cannot use an accelerator its
    # parent has initialised (CUDA refuses to initialise again after a fork).
    cores = payback.cores() if exported.target.COMPILES_IN_FORKS else 1
    workers = max(1, min(cores, len(planned) - 1))
    budget, outlook = Budget(spec.compile.search_budget_s, workers), Outlook(planned, store, workers)
    guess = (
        None
        if expected_s("compile") is not None  # the last build of this model here says it better
        else first_guess.first_compile(exported.program, exported.target, store.directory)
    )
    for line in outlook.before_search(guess):
        say(line)
    outlook.start(guess)
    first, plans = planned[0][0], dict(planned)
    search = _Search(exported, planned, weights_file, work_dir, store, budget)
    started = time.perf_counter()
    search.compile_and_verify(first)
    first_s = time.perf_counter() - started
    outlook.first(first, first_s, from_cache=search.from_cache(first))
    cost, chosen, noise = payback.Cost(workers=workers), list[payback.Expected](), None
    if len(planned) > 1:
        noise = search.noise() if first in search.passed else None
        chosen, refused, cost = choose_candidates(exported, planned, noise, budget, store, cost)
        skipped += refused
        outlook.announce(
            first,
            first_s,
            [e.name for e in chosen],
            [s.name for s in refused if s.recorded == payback.OVER_BUDGET],
            {e.name: e.cost for e in chosen},
        )
        cost = search.compile_candidates([e.name for e in chosen], workers, outlook, cost)
    if not search.passed:  # the first candidate's own report, with every case's diffs
        more = f"\n(all {len(search.failed)} compile candidates failed verification)" if len(search.failed) > 1 else ""
        failure = search.first_failure
        assert failure is not None  # every candidate failed verification: the first one's error
        raise VerificationError(failure.message + more, failure.hint) from failure
    timed, cost = search.time_passed(noise, cost)
    if len(planned) == 1:
        choice, why = first, ""
    elif list(timed) == [first]:
        choice, why = first, search.kept_alone(cost)
    else:
        choice, why = rounds.choose(timed, first)
    if choice != first and first in timed:
        cost = dataclasses.replace(cost, won=timed[first].median_ms / timed[choice].median_ms)
    trials = search.trials(timed, shown=len(planned) > 1)
    return Tuned(
        compiled=search.passed[choice],
        chosen=choice,
        plan=plans[choice],
        trials=trials,
        skipped=tuple(skipped),
        why=why,
        cost=cost,
        graph_ops=first_guess.graph_ops(exported.program),
    )


def choose_candidates(
    exported: Exported,
    planned: list[tuple[str, CompilePlan]],
    noise: rounds.Timed | None,
    budget: Budget,
    store: Cache,
    cost: payback.Cost,
) -> tuple[list[payback.Expected], list[Skipped], payback.Cost]:
    """The candidates worth compiling, best expected gain per compile second first, and those left
    out (an earlier build measured them no faster, they cannot win beyond the noise, or the budget is
    spent), said as they are decided. When the noise leaves none to compile, the search stops."""
    spec, first, plans = exported.spec_file.spec, planned[0][0], dict(planned)
    earlier = payback.earlier_search(store.directory, spec.model.name, exported.target.NAME)
    expected = payback.expectations([name for name, _ in planned[1:]], earlier)
    refused, noisy, open_ = [], [], []
    gate = noise is not None and not spec.compile.search_when_noisy
    for one in expected:
        if why := payback.payback_refusal(one, first):
            refused.append(Skipped(one.name, why, payback.NO_PAYBACK))
        elif why := payback.noise_refusal(one, noise, first) if gate and noise is not None else None:
            noisy.append(Skipped(one.name, why, payback.NOISY))
        else:
            open_.append(one)
    if noise is not None:
        cost = dataclasses.replace(cost, spread=payback.spread(noise))
    for skip in refused:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    if noisy and not open_ and noise is not None:
        line = payback.stopped_line(noise, first, len(noisy))
        say(line)
        return [], refused + noisy, dataclasses.replace(cost, stopped=line.strip())
    refused += noisy
    for skip in noisy:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    chosen, over = payback.select(open_, budget, lambda name: store.has(plans[name].key))
    for one, why in over:
        refused.append(Skipped(one.name, why, payback.OVER_BUDGET))
        say(f"    candidate {one.name}: not tried: {why}")
    return chosen, refused, cost


class _Search:
    """The candidates as they are compiled and verified: those that passed, those dropped."""

    def __init__(
        self,
        exported: Exported,
        planned: list[tuple[str, CompilePlan]],
        weights_file: Path | None,
        work_dir: Path,
        store: Cache,
        budget: Budget,
    ) -> None:
        self.exported, self.planned, self.plans = exported, planned, dict(planned)
        self.weights_file, self.work_dir, self.store, self.budget = weights_file, work_dir, store, budget
        self.passed: dict[str, Compiled] = {}
        self.failed: dict[str, Trial] = {}
        self.compile_s: dict[str, float] = {}
        self.first_failure: VerificationError | None = None
        self.noise_s = 0.0

    def from_cache(self, name: str) -> bool:
        return name in self.passed and self.passed[name].from_cache

    def counter(self, name: str) -> str:
        return f"{[n for n, _ in self.planned].index(name) + 1}/{len(self.planned)} {name}"

    def compile_and_verify(self, name: str, precompiled: parallel.Done | None = None) -> None:
        check_stop()  # an interrupt Python could not raise where it landed stops the search here at the latest
        index = [n for n, _ in self.planned].index(name)
        outcome = _compile_and_verify(
            self.exported,
            index,
            name,
            self.plans[name],
            self.counter(name),
            self.weights_file,
            self.work_dir,
            self.store,
            self.budget,
            precompiled,
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
        step(f"noise: {name} timed alone in {rounds.ROUNDS} rounds, before any candidate is compiled")
        started = time.perf_counter()
        timed = rounds.time_in_rounds(
            timed_calls({name: self.passed[name]}, self.weights_file, self.exported.example_inputs),
            self.exported.target.synchronize,
        )[name]
        self.noise_s = time.perf_counter() - started
        say(
            f"    noise: {name} timed alone: {timed.describe()}: a candidate must be {ratio(payback.spread(timed))} "
            "faster to win beyond it"
        )
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
            return self.time_lone(first), cost
        step(f"timing {len(self.passed)} candidate(s) in {rounds.ROUNDS} interleaved rounds")
        started = time.perf_counter()
        timed = rounds.time_in_rounds(
            timed_calls(self.passed, self.weights_file, self.exported.example_inputs), self.exported.target.synchronize
        )
        return timed, dataclasses.replace(cost, timing_s=time.perf_counter() - started)

    def time_lone(self, name: str) -> dict[str, rounds.Timed]:
        """The pinned options' time, for the build's output: one round, as nothing is compared with
        it (five took 25 s of the unet's build). Not verified yet (the verify stage does that), so a
        .so that raises on the example inputs is left untimed, for the verify stage to report."""
        step(f"timing {name} in 1 round")
        try:
            return rounds.time_in_rounds(
                timed_calls({name: self.passed[name]}, self.weights_file, self.exported.example_inputs),
                self.exported.target.synchronize,
                rounds=1,
            )
        except Exception as exc:  # noqa: BLE001 (the runner's own error: the verify stage names the case)
            say(f"    candidate {name}: not timed: it raised on the example inputs ({str(exc).splitlines()[0][:120]})")
            return {}

    def kept_alone(self, cost: payback.Cost) -> str:
        """Why the spec's own options are kept when no other candidate was there to time."""
        if cost.stopped:
            return "the search stopped on the noise before compiling a candidate"
        if self.failed:
            return f"no other candidate passed verification ({', '.join(self.failed)} dropped)"
        return "no other candidate was compiled (the lines above say why)"

    def compile_candidates(self, names: list[str], workers: int, outlook: Outlook, cost: payback.Cost) -> payback.Cost:
        """Compile the fresh ones side by side where there are cores for it, then verify each."""
        fresh = [name for name in names if not self.store.has(self.plans[name].key)]
        done: dict[str, parallel.Done] = {}
        started = time.perf_counter()
        if workers > 1 and len(fresh) > 1:
            step(f"{', '.join(self.counter(n) for n in fresh)}: compiling, {min(workers, len(fresh))} at a time")
            jobs = [(name, self.plans[name], self.trial_work(name)) for name in fresh]
            for name, _, work in jobs:
                shutil.rmtree(work, ignore_errors=True)
                self.plans[name].compile_dir.mkdir(parents=True, exist_ok=True)
            done = parallel.compile_all(self.exported, jobs, self.store.directory, min(workers, len(fresh)))
            for name in fresh:
                self.budget.spent(name, done[name].seconds)
        wall_s = time.perf_counter() - started
        for index, name in enumerate(names):
            self.compile_and_verify(name, done.get(name))
            outlook.after([] if done else names[index + 1 :])  # side by side: all compiled already
        if not done:
            wall_s = sum(self.compile_s.get(name, 0.0) for name in fresh)
        spent = sum(self.compile_s.get(name, 0.0) for name in fresh)
        return dataclasses.replace(
            cost,
            compiled=len(fresh),
            compile_s=spent,
            compile_wall_s=wall_s,
            noise_s=self.noise_s,
            workers=min(workers, max(1, len(fresh))),
        )

    def trial_work(self, name: str) -> Path:
        return self.work_dir / "candidates" / name

    def trials(self, timed: dict[str, rounds.Timed], shown: bool) -> tuple[Trial, ...]:
        """Every candidate compiled, in the planned order, each one's line said."""
        out = []
        for name, plan in self.planned:
            if name in self.passed and name in timed:
                t, cached = timed[name], self.passed[name].from_cache
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
                    )
                )
                line = t.describe() if shown else f"{figure(t.median_ms)} ms"  # pinned: nothing to compare
                say(f"    candidate {name}: {line}{' (cached)' if cached else ''}")
            elif name in self.passed:  # a lone candidate that raised while timed: the verify stage says why
                out.append(Trial(name, plan.options, True, None, self.passed[name].from_cache))
            elif name in self.failed:
                out.append(self.failed[name])
        return tuple(out)


def as_locked(tuned: Tuned, locked: Locked) -> Tuned:
    """A build from a lock compiled its choice alone: it records the search as it ran when the
    choice was locked (the other candidates as they were then, untimed here), so its manifest is
    the one that search's build wrote."""
    ran = {trial.name: trial for trial in tuned.trials}
    recorded: list[dict[str, Any]] = locked.search.get("candidates") or []
    if tuned.chosen != locked.chosen or not any(c["name"] == locked.chosen for c in recorded):
        return tuned  # a lock from before the search was recorded in it: this build's own record
    # from_cache as the chosen one's: the others were not compiled here either way
    trials = tuple(
        ran[locked.chosen]
        if c["name"] == locked.chosen
        else Trial(
            c["name"],
            c["options"],
            c["verified"],
            None,
            ran[locked.chosen].from_cache,
            "locked: not compiled in this build",
        )
        for c in recorded
    )
    skipped = tuple(Skipped(s["name"], s["reason"]) for s in locked.search.get("not_tried", []))
    why = f"locked in {locked.path.name}" + (f" (the search there: {locked.why})" if locked.why else "")
    return dataclasses.replace(tuned, trials=trials, skipped=skipped, why=why)


def _compile_and_verify(
    exported: Exported,
    index: int,
    name: str,
    plan: CompilePlan,
    counter: str,
    weights_file: Path | None,
    work_dir: Path,
    store: Cache,
    budget: Budget,
    precompiled: parallel.Done | None = None,
) -> Compiled | tuple[Trial, VerificationError | None]:
    """The candidate compiled and verified, or (the Trial saying why it was dropped, its
    VerificationError or None): that error is the build's message when every candidate fails.
    ``precompiled``: a worker compiled it into the cache (parallel.py); it is taken from there."""
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
            compiled = _compile(exported, name, plan, counter, trial_work, store, budget)
    except (CompileError, ExportError) as exc:
        if index == 0:  # the spec's own options: their failure is the build's
            raise
        say(f"    candidate {name}: did not compile, dropped ({exc.message.splitlines()[0][:120]})")
        return Trial(name, plan.options, False, None, False, exc.message.splitlines()[0]), None
    if counter.startswith("1/1 "):
        # A lone candidate (the options pinned: search = false, --no-search, a lock entry) has nothing
        # to be chosen over: the verify stage checks the .so the wheel ships, and verifying it here
        # too doubled the verification (70 s of the unet's build)
        return compiled
    try:
        verify_model(exported, compiled, trial_work, weights_file, f"{counter}: verifying ")
    except VerificationError as exc:
        say(f"    candidate {name}: fails verification, dropped ({exc.message.splitlines()[0][:160]})")
        return Trial(name, plan.options, False, None, compiled.from_cache, exc.message.splitlines()[0]), exc
    say(f"    candidate {name}: verified{' (cached)' if compiled.from_cache else ''}")
    return compiled


def _compile(
    exported: Exported, name: str, plan: CompilePlan, counter: str, trial_work: Path, store: Cache, budget: Budget
) -> Compiled:
    """One candidate compiled here (or taken from the cache), its fresh compile time counted."""
    step(f"{counter}: compiling")
    shutil.rmtree(trial_work, ignore_errors=True)
    plan.compile_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    compiled = compile_model(exported, plan, trial_work, store)
    if not compiled.from_cache:
        budget.spent(name, time.perf_counter() - started)
    return compiled


def install(tuned: Tuned, exported: Exported, output_dir: Path, work_dir: Path, store: Cache) -> Compiled:
    """Put the chosen candidate's artifacts at the output path the wheel records.

    A CPU .so runs from any folder (its bytes record where it was compiled, which is why
    candidates compile at a stable path): it is copied. A CUDA .so finds its kernels by the path
    it was compiled at, so the chosen candidate is compiled again at the output path.
    """
    if tuned.compiled.output_dir == output_dir:
        return tuned.compiled
    if not targets.get(tuned.compiled.target).RELOCATABLE:
        return compile_model(exported, plan_in(exported, tuned.plan, output_dir), work_dir / "final", store)
    artifacts = []
    for artifact in tuned.compiled.artifacts:
        shutil.copyfile(artifact, output_dir / artifact.name)
        artifacts.append(output_dir / artifact.name)
    if tuned.compiled.constants is not None:  # its constants store (static batch sizes: pipeline/features/constants.py)
        for name in (constants.INDEX_FILE, constants.BLOB_FILE):
            shutil.copyfile(tuned.compiled.constants / name, output_dir / name)
    return dataclasses.replace(
        tuned.compiled,
        output_dir=output_dir,
        library=output_dir / tuned.compiled.library.name,
        artifacts=tuple(artifacts),
        constants=output_dir if tuned.compiled.constants is not None else None,
    )
