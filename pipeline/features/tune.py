"""Choosing compile options: compile and verify each candidate, then time those that pass together
(pipeline/features/rounds.py): the spec's own options stay unless another wins beyond the measured noise.
What the search may spend, and on which candidates, is payback.py's; how long it should take,
outlook.py's; the compiles side by side, parallel.py's; each candidate's compile, verification and
timing, search.py's.

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

from .. import targets
from ..errors import VerificationError
from ..services.cache import Cache
from ..services.progress import expected_s, say
from ..services.wording import apart, ratio
from ..stages import constants
from ..stages.compile import Compiled, CompilePlan, compile_model, plan_compile, plan_in
from ..stages.export import Exported
from ..wheel_template.runtime._schema import CompileSearch
from . import first_guess, payback, rounds
from . import outlook as search_time
from .candidates import Skipped, candidates
from .lock import Locked, lock_path
from .outlook import Outlook, shorter  # noqa: F401 (shorter: the search's, named here too)
from .payback import COMPILE_COST, OVER_BUDGET, Budget
from .search import Search, Trial


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
    threads: int | None = None  # the OpenMP threads its timing rounds ran on (None: no rounds)
    # an --update-lock search that left the entry: why (it did not decide, or did not beat the entry's
    # options), and its cost where the lone compile of the entry's options replaced it
    entry_kept_why: str = ""
    searched: payback.Cost | None = None
    searched_candidates: tuple[dict[str, Any], ...] = ()  # its candidates, by name, from the build cache or not

    def not_decided(self) -> str:
        """Why this search's choice is no decision to lock ("" where it is one): the noise stopped it,
        its rounds could not tell the candidates apart, or its budget left room for no candidate beyond
        the first (H46: a 25 s budget locked spec-options, compared with nothing, and a larger budget
        later never searched)."""
        if self.cost.stopped:
            return "the noise stopped it"
        if self.cost.undecided:
            return "its rounds could not tell the candidates apart"
        if len(self.trials) < 2 and any(skip.recorded == OVER_BUDGET for skip in self.skipped):
            return f"its compile budget left room for no candidate beyond {self.chosen}"
        return ""

    def keeps_entry(self, entry_chosen: str) -> str:
        """Why --update-lock's choice does not replace the entry's ("" where it does): it must be
        faster than the entry's options beyond the noise, by the rule the search holds the spec's
        options to, where both were timed. H66's three --update-lock searches minutes apart locked
        freezing, freezing+channels-last, then spec-options, the first by a 0.4 ms round."""
        timed = {trial.name: trial.spread_ms for trial in self.trials if trial.spread_ms}
        new, old = timed.get(self.chosen), timed.get(entry_chosen)
        if self.chosen == entry_chosen or new is None or old is None or new[1] < old[0]:
            return ""
        slowest, fastest = apart(new[1], old[0])
        return (
            f"the search's {self.chosen} is not faster than the entry's {entry_chosen} beyond the noise (its slowest "
            f"round, {slowest} ms, is not under {entry_chosen}'s fastest, {fastest} ms)"
        )

    def manifest_record(self) -> CompileSearch:
        """The manifest's record of the search (its timings stay in the report: in the manifest
        they would make every wheel's bytes differ)."""
        return {
            "chosen": self.chosen,
            "candidates": [{"name": t.name, "options": t.options, "verified": t.passed} for t in self.trials],
            "not_tried": [{"name": s.name, "reason": s.stable_reason} for s in self.skipped],
        }

    def report_record(self) -> dict[str, Any]:
        """The report's record of the search: the manifest's, with why, the timings and the cost."""
        return (
            {
                "chosen": self.chosen,
                "why": self.why,
                "candidates": [dataclasses.asdict(trial) for trial in self.trials],
                "not_tried": [dataclasses.asdict(skip) for skip in self.skipped],
                "cost": dataclasses.asdict(self.cost),  # what the search cost and won (payback.py)
                "graph_ops": self.graph_ops,  # with the first compile's seconds: a first build's guess (first_guess.py)
                "threads": self.threads,  # what its rounds ran on: the lock's entry says it (lock.py)
            }
            | (
                {"entry_kept_why": self.entry_kept_why, "searched_candidates": list(self.searched_candidates)}
                if self.entry_kept_why
                else {}
            )
            | ({"searched_cost": dataclasses.asdict(self.searched)} if self.searched else {})
        )


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


# A newcomer's --no-search build said "chose pinned": a choice, of a candidate named nowhere else.
LONE = "the only candidate, as the option search is off"


def compile_header(tried: int, left_out: list[str], out_dir: Path, beyond: int = 0) -> str:
    """The compile stage's first line, in counts that add up with the lines after it: a newcomer read
    "4 candidate(s)", then a fifth "not tried", then "3 other candidate(s)"."""
    # the folder said to be the build's only: a newcomer found it empty after the build, as it is
    # meant to be, and the compile line had not said so
    held = " (held while the build runs; the wheel carries the files)"
    if tried == 1 and not left_out:
        return f"1 candidate, into {out_dir}{held}"  # "compiled to" read oddly before "reused the compiled model"
    aside = f" (and {len(left_out)} not tried: {', '.join(left_out)}, below)" if left_out else ""
    # "as ... allows": the budget can leave some out once the first compile is timed (a newcomer read
    # "4 candidates to try", then saw three tried)
    allows = ", as the search's budget allows" if tried > 1 else ""
    if beyond:  # those it likely leaves out not counted as allowed (H47: "4 … as the budget allows", 3 beyond it)
        allows = f", of which the search's budget likely allows {tried - beyond}"
    return f"{tried} candidate{'s' if tried > 1 else ''} to try{allows}{aside}; the chosen one to {out_dir}{held}"


def search_workers(exported: Exported, planned: list[tuple[str, CompilePlan]]) -> int:
    """How many candidates compile side by side: where the target allows it, one on each core (a
    forked worker cannot use an accelerator its parent has initialised: CUDA refuses to again)."""
    cores = payback.cores() if exported.target.COMPILES_IN_FORKS else 1
    return max(1, min(cores, len(planned) - 1))


def likely_compiled(exported: Exported, planned: list[tuple[str, CompilePlan]], store: Cache) -> list[str]:
    """The fresh candidates the search's budget likely lets compile (outlook.counted), a budget in
    seconds counted against the model's earlier compile here or the graph's guess: the compile
    stage's first line, the estimate before the search and the earlier build's scaled stage time
    all count these."""
    fresh = [name for name, plan in planned if not store.has(plan.key)]
    first_fresh = bool(planned) and planned[0][0] in fresh
    budget_s = exported.spec_file.spec.compile.search_budget_s
    plain_s = (
        first_guess.plain_compile_s(
            exported.program, exported.target, store.directory, exported.spec_file.spec.model.name
        )
        if budget_s and first_fresh
        else None
    )
    return search_time.counted(fresh, first_fresh, search_workers(exported, planned), budget_s, plain_s)


def likely_left_out(exported: Exported, planned: list[tuple[str, CompilePlan]], store: Cache) -> list[str]:
    """The fresh candidates the search's budget likely leaves out: the compile stage's first line counts them apart."""
    compiles = likely_compiled(exported, planned, store)
    return [name for name, plan in planned if not store.has(plan.key) and name not in compiles]


def compile_estimate(tuned: Tuned, name: str) -> tuple[float, str] | None:
    """How long compiling ``name`` should take after this search, from its first fresh compile (both
    candidates' costs counted), and what that rests on; None where that compile was not fresh."""
    first = tuned.trials[0] if tuned.trials else None
    if first is None or not first.compile_s:
        return None
    cost = COMPILE_COST.get(name, 1.0)
    said = f", {name} as {ratio(cost)} a compile" if cost != 1.0 else ""
    return first.compile_s / COMPILE_COST.get(first.name, 1.0) * cost, f"from this build's first compile{said}"


def expected_rounds(exported: Exported, planned: list[tuple[str, CompilePlan]], store: Cache) -> float:
    """How many compiles' time the planned fresh compiles should take, as the budget runs them."""
    first_fresh = bool(planned) and not store.has(planned[0][1].key)
    return search_time.rounds_of(
        likely_compiled(exported, planned, store), first_fresh, search_workers(exported, planned)
    )


def tune(
    exported: Exported,
    planned: list[tuple[str, CompilePlan]],
    skipped: list[Skipped],
    weights_file: Path | None,
    work_dir: Path,
    store: Cache,
    time_lone: bool = True,
) -> Tuned:
    """A line per candidate; the live status says what is being done now (``2/4 freezing: compiling``).
    The spec's own options are compiled, verified and timed alone first (the noise); the candidates
    that could win beyond it and that the budget allows are compiled side by side, then verified
    one at a time; those that pass are timed together, in interleaved rounds (rounds.py), and the
    spec's own options stay unless one wins beyond the spread measured in those rounds.
    ``time_lone``: a lone candidate (the options pinned) is timed in one round, for the report."""
    for skip in skipped:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    spec, skipped = exported.spec_file.spec, list(skipped)
    workers = search_workers(exported, planned)
    budget, outlook = (
        Budget(spec.compile.search_budget_s, workers),
        Outlook(planned, store, workers, own_spec=exported.spec_file.path.suffix == ".toml"),
    )
    guess = (
        None
        if expected_s("compile") is not None  # the last build of this model here says it better
        else first_guess.first_compile(exported.program, exported.target, store.directory)
    )
    likely = likely_compiled(exported, planned, store)
    for line in outlook.before_search(guess, likely):
        say(line)
    outlook.start(guess)
    first, plans = planned[0][0], dict(planned)
    search = Search(exported, planned, weights_file, work_dir, store, budget, time_lone)
    search.count_likely(likely)
    counted_first = len(search.order)
    started = time.perf_counter()
    search.compile_and_verify(first)
    first_s = time.perf_counter() - started
    outlook.first(first, first_s, from_cache=search.from_cache(first), compile_s=search.compile_s.get(first))
    cost, chosen, noise = payback.Cost(workers=workers), list[payback.Expected](), None
    if len(planned) > 1:
        noise = search.noise() if first in search.passed else None
        outlook.noise(search.noise_s)
        chosen, refused, cost = choose_candidates(exported, planned, noise, budget, store, cost)
        skipped += refused
        search.narrow([e.name for e in chosen])
        outlook.announce(
            first,
            first_s,
            [e.name for e in chosen],
            [s.name for s in refused if s.recorded == payback.OVER_BUDGET],
            {e.name: e.cost for e in chosen},
            others=len(skipped) - sum(s.recorded == payback.OVER_BUDGET for s in refused),
            counted_before=counted_first,
        )
        cost = search.compile_candidates([e.name for e in chosen], workers, outlook, cost)
    if not search.passed:  # the first candidate's own report, with every case's diffs
        more = f"\n(all {len(search.failed)} compile candidates failed verification)" if len(search.failed) > 1 else ""
        failure = search.first_failure
        assert failure is not None  # every candidate failed verification: the first one's error
        raise VerificationError(failure.message + more, failure.hint) from failure
    timed, cost = search.time_passed(noise, cost)
    if len(planned) == 1:  # a lock's entry says where it came from (as_locked)
        choice, why = first, "" if spec.compile.search else LONE
    elif list(timed) == [first]:
        choice, why = first, search.kept_alone(cost, skipped)
    else:
        lockable = lock_path(exported.spec_file.path) is not None  # not a --hf build's own spec
        doubt = payback.undecided(timed, first, lockable)
        # no median to praise beside "no median here can be trusted" (a newcomer read both at once)
        choice, why = rounds.choose(timed, first, medians_trusted=not doubt)
        if choice == first and doubt:  # said after the choice (build.py)
            cost = dataclasses.replace(cost, undecided=doubt.strip())
    if choice != first and first in timed:
        cost = dataclasses.replace(cost, won=timed[first].median_ms / timed[choice].median_ms)
    trials = search.trials(timed, shown=len(planned) > 1, noise=noise)
    return Tuned(
        compiled=search.passed[choice],
        chosen=choice,
        plan=plans[choice],
        trials=trials,
        skipped=tuple(skipped),
        why=why,
        cost=cost,
        graph_ops=first_guess.graph_ops(exported.program),
        threads=next((one.threads for one in timed.values()), None),
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
    carried = {c["name"]: c for c in earlier.get("candidates", ())}  # an untimed candidate's report keeps it
    refused, noisy, open_, too_noisy = [], [], [], list[payback.Expected]()
    gate = noise is not None and not spec.compile.search_when_noisy
    for one in expected:
        if why := payback.payback_refusal(one, first):
            refused.append(Skipped(one.name, why, payback.NO_PAYBACK, carried.get(one.name)))
        elif why := payback.noise_refusal(one, noise, first) if noise is not None else None:
            if gate:
                noisy.append(Skipped(one.name, why, payback.NOISY, carried.get(one.name)))
                too_noisy.append(one)
                continue
            # what the setting changed, said (a newcomer who set it saw it nowhere)
            say(f"    candidate {one.name}: kept in by `[compile] search_when_noisy = true`, though it {why}")
            open_.append(one)
        else:
            open_.append(one)
    if noise is not None:
        cost = dataclasses.replace(cost, spread=payback.spread(noise))
    for skip in refused:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    if noisy and not open_ and noise is not None:
        best = max(too_noisy, key=lambda one: one.gain)
        line = payback.stopped_line(noise, first, len(noisy), best)
        say(line)
        return [], refused + noisy, dataclasses.replace(cost, stopped=line.strip())
    refused += noisy
    for skip in noisy:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    chosen, over = payback.select(open_, budget, lambda name: store.has(plans[name].key))
    for one, why in over:
        refused.append(Skipped(one.name, why, payback.OVER_BUDGET, carried.get(one.name)))
        say(f"    candidate {one.name}: not tried: {why}")
    return chosen, refused, cost


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
    # "the search that wrote it": the reason's figures are that search's, not this build's (a newcomer's
    # AVX2 build quoted "the noise measured in this run", though it measured nothing; H61 read its 2750 ms
    # beside this build's 121 ms a call, with no word of where that was timed)
    source = (
        f"the options {locked.path.name} records" if locked.path.suffix == ".whl" else f"locked in {locked.path.name}"
    )
    why = source + (
        f" (the entry's reason, from the search that wrote it, timed where it ran: {locked.why})" if locked.why else ""
    )
    return dataclasses.replace(tuned, trials=trials, skipped=skipped, why=why)


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
