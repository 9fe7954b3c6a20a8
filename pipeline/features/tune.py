"""Choosing compile options: compile and verify each candidate, then time those that pass together
(pipeline/features/rounds.py): the spec's own options stay unless another wins beyond the measured noise.

Candidates (with `[compile] search = true`, the default): the spec's own options, freezing
(not with external weights: it folds weights into the code), freezing with channels-last
convolutions, max-autotune, and bfloat16 autocast with freezing where the spec's tolerances
allow it (screened in eager first, so a model they refuse costs no compile). Each is compiled
(or taken from the compile cache) and verified against eager on every case; a failing
candidate is dropped. `search = false` pins the spec's options.

Candidates that cannot win are not compiled: channels-last without convolutions, max-autotune
without matmuls or convolutions (eager's FLOP counter says which the model runs). The search
has a compile-time budget that scales with the model: a candidate whose expected compile time
(the first fresh compile's, times its cost factor) would take the search past the budget is
skipped, with the reason, as are all after it that are not cached.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..stages import constants, precision
from . import rounds
from .lock import Locked
from .. import targets
from ..errors import CompileError, ExportError, VerificationError
from ..services.cache import Cache
from ..services.progress import check_stop, duration, estimate, expected_s, say, step
from ..wheel_template.runtime import _compare as wheel_compare
from ..stages.compile import CompilePlan, Compiled, compile_model, plan_compile, plan_in
from ..stages.export import Exported
from ..stages.loader import call_forward
from ..stages.verify import as_tuple, open_runner, tolerances, verification_cases, verify_model

# The search's default budget: BUDGET_FACTOR x the first fresh compile, at least MIN_BUDGET_S.
BUDGET_FACTOR, MIN_BUDGET_S = 3.0, 60.0
# A candidate's compile time against a plain compile's: max-autotune benchmarks kernel choices.
COMPILE_COST = {"max-autotune": 3.0}
CONVOLUTIONS = {"convolution"}
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}


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


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str  # what the build says and its report keeps, with the seconds measured where there are any
    recorded: str = ""  # the reason without measured values, for the manifest: a wheel's bytes never hold timings

    @property
    def stable_reason(self) -> str:
        return self.recorded or self.reason


@dataclass(frozen=True)
class Tuned:
    compiled: Compiled  # the chosen candidate, still in its trial folder
    chosen: str
    plan: CompilePlan  # the chosen candidate's
    trials: tuple[Trial, ...]
    skipped: tuple[Skipped, ...] = ()
    why: str = ""  # why the chosen candidate was chosen (pipeline/features/rounds.py)


BF16 = ("bf16-autocast", {"freezing": True, precision.AUTOCAST_OPTION: precision.AUTOCAST_DTYPE})


def candidates(exported: Exported, locked: Locked | None = None) -> tuple[list[tuple[str, dict]], list[Skipped]]:
    """The candidates to compile, and those ruled out beforehand (with why). A matching lock
    entry (lock.py) is the one candidate: what the search chose before, with no search."""
    spec = exported.spec_file.spec
    if not spec.compile.search:
        return [("pinned", {})], []
    if locked is not None:
        return [(locked.chosen, locked.overrides)], []
    found, skipped, ops = [("spec-options", {})], [], heavy_ops(exported)
    if not spec.weights.external and not spec.compile.freezing:
        found.append(("freezing", {"freezing": True}))
        if ops is None or ops & CONVOLUTIONS:
            found.append(("freezing+channels-last", {"freezing": True, "force_layout_optimization": True}))
        else:
            skipped.append(Skipped("freezing+channels-last", "the model runs no convolutions: it would compile to the same code as freezing"))
    if not spec.compile.max_autotune:
        if ops is None or ops & (CONVOLUTIONS | MATMULS):
            found.append(("max-autotune", {"max_autotune": True}))
        else:
            skipped.append(Skipped("max-autotune", "the model runs no matmuls or convolutions: nothing for autotuning to choose kernels for"))
    reason = reduced_precision_refusal(exported)
    return (found + [BF16], skipped) if reason is None else (found, skipped + [Skipped(BF16[0], reason)])


def heavy_ops(exported: Exported) -> set[str] | None:
    """The aten ops with FLOPs that eager runs on the example inputs (``convolution``, ``mm``…),
    or None when they cannot be counted (then no candidate is ruled out for it)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            exported.module(*exported.example_inputs)
    except Exception:  # the user's forward can raise anything; export will say it properly
        return None
    return {str(op).split(".")[-1] for op, flops in counter.get_flop_counts().get("Global", {}).items() if flops}


def reduced_precision_refusal(exported: Exported) -> str | None:
    """Why the bfloat16 candidate is not worth compiling here, or None when it is."""
    if exported.spec_file.spec.compile.autocast:
        return "the spec's own options already use autocast"
    if exported.spec_file.spec.weights.external:
        return "external weights stay float32 tensors the runtime supplies; reduced precision needs them folded into the .so"
    if "float32" not in exported.output_dtypes:
        return "the model has no float32 output"
    target = exported.target
    if not target.bf16_native():
        return target.BF16_SLOW
    return screen_autocast(exported)


def screen_autocast(exported: Exported) -> str | None:
    """Eager under autocast against eager in float32, on every verification case, with the spec's
    tolerances: if eager already misses them, the compiled candidate would too."""
    tols, names = tolerances(exported), [o.name for o in exported.spec_file.spec.outputs]
    wrapped = precision.wrap(exported)
    for case in verification_cases(exported):
        # This runs before export: a model that fails on some case must fail in export or
        # verification with their messages, not here.
        try:
            with torch.no_grad():
                want = as_tuple(call_forward(exported.module, case.inputs), exported.returns_tuple)
        except Exception as exc:  # the user's forward can raise anything
            return f"eager raised {type(exc).__name__} on case {case.name}, so it could not be screened"
        try:
            with torch.no_grad():
                got = as_tuple(wrapped(*case.inputs), exported.returns_tuple)
        except Exception as exc:  # an op without a bfloat16 kernel, for instance
            return f"eager under {precision.AUTOCAST_DTYPE} autocast raised {type(exc).__name__} on case {case.name}: {exc}"
        for name, g, w in zip(names, got, want):
            diff = wheel_compare.compare(name, g, w, *tols[name])
            if not diff.passed:
                return f"the spec's tolerances refuse it: eager under {precision.AUTOCAST_DTYPE} autocast, case {case.name}: {diff.describe()}"
    return None


def plans(exported: Exported, cxx_version: str, output_dir: Path, keep_debug: bool = False,
          locked: Locked | None = None) -> tuple[list[tuple[str, CompilePlan]], list[Skipped]]:
    """Each candidate compiles in ``output_dir/.candidates/<name>``: a path that is the same in every
    build of this model version (the .so records where it was compiled, and wheels must be
    reproducible) and different for every candidate (a process cannot load two .so at one path).
    A lone candidate of a target whose .so must stay where it was compiled compiles in place."""
    found, skipped = candidates(exported, locked)
    in_place = len(found) == 1 and not exported.target.RELOCATABLE
    where = lambda name: output_dir if in_place else output_dir / ".candidates" / name  # noqa: E731
    return [(name, plan_compile(exported, cxx_version, where(name), overrides, keep_debug))
            for name, overrides in found], skipped


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


# A budget refusal as the manifest records it: its seconds differ run to run (the report has them).
OVER_BUDGET = "over the search's compile budget (the build's report has the seconds)"


class Budget:
    """How much compiling the search may still do, measured on its own fresh compiles."""

    def __init__(self, given_s: float | None) -> None:
        self.given_s, self.spent_s, self.plain_s = given_s, 0.0, None

    def spent(self, name: str, seconds: float) -> None:
        self.spent_s += seconds
        if self.plain_s is None:
            self.plain_s = seconds / COMPILE_COST.get(name, 1.0)

    def refusal(self, name: str) -> str | None:
        """Why ``name`` is not compiled (it would take the search past its budget), or None."""
        if self.plain_s is None:  # nothing compiled fresh yet: nothing to predict from
            return None
        budget = self.given_s or max(MIN_BUDGET_S, BUDGET_FACTOR * self.plain_s)
        expected = self.plain_s * COMPILE_COST.get(name, 1.0)
        if self.spent_s + expected <= budget:
            return None
        source = "[compile] search_budget_s" if self.given_s else f"{BUDGET_FACTOR:g}x the first compile, at least {MIN_BUDGET_S:g} s"
        return (f"over the search's compile budget: {self.spent_s:.0f} s spent, about {expected:.0f} s more expected, "
                f"budget {round(budget, 1):g} s ({source})")


SHORTER = ("    to make it shorter: `[compile] search = false` in the spec (one compile, the spec's options), "
           "a smaller `[compile] search_budget_s` (fewer candidates), or build again unchanged (compiles come "
           "from the build cache, build/cache)")


class Outlook:
    """About how long the search has left, from the time its first fresh candidate took to
    compile and verify (times its cost factor for each fresh candidate still to come)."""

    def __init__(self, planned: list[tuple[str, CompilePlan]], store: Cache) -> None:
        self.order = [name for name, _ in planned]
        self.fresh = {name for name, plan in planned if not store.has(plan.key)}
        self.plain_s: float | None = None

    def before_search(self) -> list[str]:
        """What the search will cost here, said before it starts: from the last build's compile
        stage where there was one, else in compiles (the first one's time gives the estimate)."""
        if len(self.order) < 2 or not self.fresh:
            return []
        cached = len(self.order) - len(self.fresh)
        what = (f"    search: {len(self.fresh)} candidate(s) to compile and verify"
                + (f" ({cached} more from the cache)" if cached else "") + ", then all timed together")
        last = expected_s("compile")
        if last:
            what += f": about {duration(last)} on this machine (the last build's compile stage)"
        else:
            what += (f": each is a full compile, so about {len(self.fresh)}x one compile on this machine "
                     "(said once the first is timed)")
        return [what, SHORTER]

    def coming(self, after: int, budget: Budget) -> tuple[list[str], list[str]]:
        """The fresh candidates after index ``after`` the search's budget will compile, and those
        it will skip, as Budget.refusal() will decide them one by one."""
        ahead = copy.copy(budget)
        compiled, skipped = [], []
        for name in self.order[after + 1:]:
            if name not in self.fresh:
                continue
            if ahead.refusal(name):
                skipped.append(name)
                continue
            compiled.append(name)
            if ahead.plain_s is not None:
                ahead.spent_s += ahead.plain_s * COMPILE_COST.get(name, 1.0)
        return compiled, skipped

    def left_s(self, after: int, budget: Budget) -> float | None:
        """What the fresh candidates after index ``after`` should take to compile and verify."""
        if self.plain_s is None:
            return None
        return sum(self.plain_s * COMPILE_COST.get(name, 1.0) for name in self.coming(after, budget)[0])

    def done(self, index: int, name: str, seconds: float, from_cache: bool, budget: Budget) -> None:
        """A candidate is compiled and verified: the first fresh one sets the estimate."""
        if from_cache or name not in self.fresh:
            return
        first = self.plain_s is None
        if first:
            self.plain_s = seconds / COMPILE_COST.get(name, 1.0)
        left = self.left_s(index, budget)
        if left is None or len(self.order) < 2:
            return
        compiled, skipped = self.coming(index, budget)
        if first and (compiled or skipped):
            over = (f"; {', '.join(skipped)} would take the search past its compile budget: not compiled"
                    if skipped else "")
            say(f"    candidate {name} took {duration(seconds)} to compile and verify: about {duration(left)} more "
                f"for the other {len(compiled)} candidate(s){over}, then the timing")
        estimate(left if compiled else None)  # the timing rounds are not compiles: no estimate for them


def tune(exported: Exported, planned: list[tuple[str, CompilePlan]], skipped: list[Skipped], weights_file: Path | None,
         work_dir: Path, store: Cache) -> Tuned:
    """A line per candidate; the live status says what is being done now (``2/4 freezing: compiling``).
    Every candidate is compiled and verified first; those that pass are then timed together, in
    interleaved rounds (pipeline/features/rounds.py), and the spec's own options stay unless one wins
    beyond the spread measured in those rounds."""
    for skip in skipped:
        say(f"    candidate {skip.name}: not tried: {skip.reason}")
    skipped, budget = list(skipped), Budget(exported.spec_file.spec.compile.search_budget_s)
    failed, passed, first_failure = {}, {}, None
    outlook = Outlook(planned, store)
    for line in outlook.before_search():
        say(line)
    for index, (name, plan) in enumerate(planned):
        check_stop()  # an interrupt Python could not raise where it landed stops the search here at the latest
        over = budget.refusal(name) if index > 0 and not store.has(plan.key) else None
        if over:
            skipped.append(Skipped(name, over, OVER_BUDGET))
            say(f"    candidate {name}: not tried: {over}")
            continue
        left = outlook.left_s(index - 1, budget)
        if left is not None:
            estimate(left)
        started = time.perf_counter()
        outcome = _compile_and_verify(exported, index, name, plan, f"{index + 1}/{len(planned)} {name}", weights_file,
                                      work_dir, store, budget)
        outlook.done(index, name, time.perf_counter() - started,
                     from_cache=not isinstance(outcome, tuple) and outcome.from_cache, budget=budget)
        if isinstance(outcome, tuple):
            failed[name] = outcome[0]
            first_failure = first_failure or outcome[1]
        else:
            passed[name] = outcome
    if not passed:  # the first candidate's own report, with every case's diffs
        more = f"\n(all {len(failed)} compile candidates failed verification)" if len(failed) > 1 else ""
        raise VerificationError(first_failure.message + more, first_failure.hint) from first_failure
    step(f"timing {len(passed)} candidate(s) in {rounds.ROUNDS} interleaved rounds")
    target = exported.target
    timed = rounds.time_in_rounds(timed_calls(passed, weights_file, exported.example_inputs), target.synchronize)
    chosen, why = rounds.choose(timed, planned[0][0]) if len(planned) > 1 else (planned[0][0], "")
    trials = []
    for name, plan in planned:
        if name in passed:
            t = timed[name]
            # unrounded: the choice is made on them
            trials.append(Trial(name, plan.options, True, t.median_ms, passed[name].from_cache,
                                rounds_ms=t.rounds_ms, spread_ms=(t.low_ms, t.high_ms)))
            shown = t.describe() if len(planned) > 1 else f"{t.median_ms:.1f} ms"  # pinned: nothing to compare
            say(f"    candidate {name}: {shown}{' (cached)' if passed[name].from_cache else ''}")
        elif name in failed:
            trials.append(failed[name])
    plan = dict(planned)[chosen]
    return Tuned(compiled=passed[chosen], chosen=chosen, plan=plan, trials=tuple(trials), skipped=tuple(skipped), why=why)


def as_locked(tuned: Tuned, locked: Locked) -> Tuned:
    """A build from a lock compiled its choice alone: it records the search as it ran when the
    choice was locked (the other candidates as they were then, untimed here), so its manifest is
    the one that search's build wrote."""
    ran = {trial.name: trial for trial in tuned.trials}
    recorded = locked.search.get("candidates")
    if tuned.chosen != locked.chosen or not any(c["name"] == locked.chosen for c in recorded or ()):
        return tuned  # a lock from before the search was recorded in it: this build's own record
    # from_cache as the chosen one's: the others were not compiled here either way
    trials = tuple(ran[locked.chosen] if c["name"] == locked.chosen else
                   Trial(c["name"], c["options"], c["verified"], None, ran[locked.chosen].from_cache,
                         "locked: not compiled in this build")
                   for c in recorded)
    skipped = tuple(Skipped(s["name"], s["reason"]) for s in locked.search.get("not_tried", []))
    why = f"locked in {locked.path.name}" + (f" (the search there: {locked.why})" if locked.why else "")
    return dataclasses.replace(tuned, trials=trials, skipped=skipped, why=why)


def _compile_and_verify(exported: Exported, index: int, name: str, plan: CompilePlan, counter: str,
                        weights_file: Path | None, work_dir: Path, store: Cache, budget: Budget):
    """The candidate compiled and verified, or (the Trial saying why it was dropped, its
    VerificationError or None): that error is the build's message when every candidate fails."""
    step(f"{counter}: compiling")
    trial_work = work_dir / "candidates" / name
    shutil.rmtree(trial_work, ignore_errors=True)
    plan.compile_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        compiled = compile_model(exported, plan, trial_work, store)
        if not compiled.from_cache:
            budget.spent(name, time.perf_counter() - started)
    except (CompileError, ExportError) as exc:
        if index == 0:  # the spec's own options: their failure is the build's
            raise
        say(f"    candidate {name}: did not compile, dropped ({exc.message.splitlines()[0][:120]})")
        return Trial(name, plan.options, False, None, False, exc.message.splitlines()[0]), None
    step(f"{counter}: verifying")
    try:
        verify_model(exported, compiled, trial_work, weights_file)
    except VerificationError as exc:
        say(f"    candidate {name}: fails verification, dropped ({exc.message.splitlines()[0][:160]})")
        return Trial(name, plan.options, False, None, compiled.from_cache, exc.message.splitlines()[0]), exc
    if not counter.startswith("1/1 "):  # a lone candidate's (pinned) one line is its time
        say(f"    candidate {name}: verified{' (cached)' if compiled.from_cache else ''}")
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
        tuned.compiled, output_dir=output_dir, library=output_dir / tuned.compiled.library.name, artifacts=tuple(artifacts),
        constants=output_dir if tuned.compiled.constants is not None else None,
    )
