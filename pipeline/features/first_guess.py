"""A first build's estimate of its first compile, made before anything of this model was timed here.

A build's time-left figures come from the last build of the same model here (its stage times)
and, in the option search, from its own first compile. A model's first build has neither while
its first compile runs: a newcomer's unet build showed no estimate for that minute or more. The
guess is a line in the graph's size, ``base + per_op * ops`` (each target's COMPILE_GUESS_S,
measured on this project's models), times how much slower or faster this machine compiled the
earlier builds of other models of the target whose reports record their graph's size.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..services.cache import first_compile_s, first_name, newest_reports
from ..targets import Target
from .payback import COMPILE_COST

EARLIER_BUILDS = 5  # the newest reports that scale the guess to this machine


@dataclass(frozen=True)
class Guess:
    seconds: float  # one plain compile of the graph
    basis: str  # said beside the estimate: what the figure is made from


def graph_ops(program: Any) -> int | None:
    """The exported graph's operator calls (None without a program: a build that needs no export)."""
    if program is None:
        return None
    return sum(1 for node in program.graph_module.graph.nodes if node.op == "call_function")


def line_s(target: Target, ops: int) -> float:
    base_s, per_op_s = target.COMPILE_GUESS_S
    return base_s + per_op_s * ops


def machine_factor(cache_dir: Path, target: Target) -> tuple[float, int]:
    """How this machine's fresh plain compiles compared with the line (their median ratio), and of
    how many earlier builds (1.0, 0 where none recorded its graph's size)."""
    ratios = []
    for report in newest_reports(cache_dir):
        search = report.get("compile_search")
        ops = search.get("graph_ops") if isinstance(search, dict) else None
        seconds = first_compile_s(report)
        if report.get("target") != target.NAME or not isinstance(ops, int) or not ops or seconds is None:
            continue
        ratios.append(seconds / line_s(target, ops))
        if len(ratios) == EARLIER_BUILDS:
            break
    return (statistics.median(ratios), len(ratios)) if ratios else (1.0, 0)


def first_compile(program: Any, target: Target, cache_dir: Path) -> Guess | None:
    """About how long the graph's first plain compile takes here, and what that figure rests on."""
    ops = graph_ops(program)
    if not ops:
        return None
    factor, builds = machine_factor(cache_dir, target)
    scaled = f", scaled by {builds} earlier build{'s' if builds != 1 else ''} here" if builds else ""
    return Guess(line_s(target, ops) * factor, f"a first guess from the graph's {ops} ops{scaled}")


def earlier_plain_s(cache_dir: Path, model: str, target: Target) -> float | None:
    """One plain compile of ``model`` here, as the newest earlier build of it that compiled its first
    candidate fresh timed it, or compiled one candidate alone (a lock's max-autotune: H49), that
    candidate's cost taken out; None where none did."""
    for report in newest_reports(cache_dir):
        if report.get("model") != model or report.get("target") != target.NAME:
            continue
        if seconds := first_compile_s(report):
            return seconds / COMPILE_COST.get(first_name(report), 1.0)
        search = report.get("compile_search") or {}
        fresh = [c for c in search.get("candidates", ()) if isinstance(c, dict) and c.get("compile_s")]
        if len(fresh) == 1:  # compiled alone, not beside another: its time is its own
            return float(fresh[0]["compile_s"]) / COMPILE_COST.get(str(fresh[0].get("name")), 1.0)
    return None


def plain_compile_s(program: Any, target: Target, cache_dir: Path, model: str) -> float | None:
    """What a budget in seconds is counted against before the search times its first compile: the
    model's own earlier compile here, else the graph's guess (H47: an estimate that counted the budget
    only on the guess promised 3 candidates and "about 42s" under a 5 s budget, for 11.8 s)."""
    earlier = earlier_plain_s(cache_dir, model, target)
    if earlier is not None:
        return earlier
    guess = first_compile(program, target, cache_dir)
    return None if guess is None else guess.seconds
