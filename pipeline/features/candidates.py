"""Which compile options the search tries, and which it rules out before compiling (with why).

The spec's own options, freezing (not with external weights: it folds weights into the code),
freezing with channels-last convolutions, max-autotune, and bfloat16 autocast with freezing where
the spec's tolerances allow it (screened in eager first, so a model they refuse costs no
compile). Channels-last without convolutions and max-autotune without matmuls or convolutions
cannot win (eager's FLOP counter says which the model runs). A matching lock entry (lock.py) is
the one candidate: what the search chose before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..spec import Spec
from ..stages import precision
from ..stages.export import Exported
from ..stages.loader import call_forward
from ..stages.verify import as_tuple
from ..stages.verify_cases import SEEDS, tolerances, verification_cases
from ..wheel_template.runtime import _compare as wheel_compare
from .lock import Locked

CONVOLUTIONS = {"convolution"}
MATMULS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str  # what the build says and its report keeps, with the seconds measured where there are any
    recorded: str = ""  # the reason without measured values, for the manifest: a wheel's bytes never hold timings
    # the report only: an earlier build's timing of it, carried forward so the next build still has
    # it (payback.earlier_search); a build that timed nothing replaced the report that held it
    earlier: dict | None = field(default=None, compare=False)

    @property
    def stable_reason(self) -> str:
        return self.recorded or self.reason


SPEC_OPTIONS = "spec-options"  # the first candidate: the spec's own options, as the search names them
BF16 = ("bf16-autocast", {"freezing": True, precision.AUTOCAST_OPTION: precision.AUTOCAST_DTYPE})


def candidates(exported: Exported, locked: Locked | None = None) -> tuple[list[tuple[str, dict]], list[Skipped]]:
    """The candidates to compile, and those ruled out beforehand (with why). A matching lock
    entry (lock.py) is the one candidate: what the search chose before, with no search."""
    spec = exported.spec_file.spec
    if not spec.compile.search:  # the spec's options alone, named as the search names them
        return [(SPEC_OPTIONS, {})], []
    if locked is not None:
        return [(locked.chosen, locked.overrides)], []
    found: list[tuple[str, dict]] = [(SPEC_OPTIONS, {})]
    skipped: list[Skipped] = []
    ops = heavy_ops(exported)
    if not spec.weights.external and not spec.compile.freezing:
        found.append(("freezing", {"freezing": True}))
        if ops is None or ops & CONVOLUTIONS:
            found.append(("freezing+channels-last", {"freezing": True, "force_layout_optimization": True}))
        else:
            skipped.append(
                Skipped(
                    "freezing+channels-last",
                    "the model runs no convolutions: it would compile to the same code as freezing",
                )
            )
    if not spec.compile.max_autotune:
        if ops is None or ops & (CONVOLUTIONS | MATMULS):
            found.append(("max-autotune", {"max_autotune": True}))
        else:
            skipped.append(
                Skipped(
                    "max-autotune",
                    "the model runs no matmuls or convolutions: nothing for autotuning to choose kernels for",
                )
            )
    refusal = reduced_precision_refusal(exported)
    return (found + [BF16], skipped) if refusal is None else (found, skipped + [refusal])


def screening_calls(spec: Spec, bf16_native: bool, locked: Locked | None) -> float:
    """The eager calls candidates() makes, counted at the example size: heavy_ops()'s one (under
    the FLOP counter), and where the bfloat16 candidate is screened, two a case (eager and under
    autocast) for as many cases as a screen that refuses it runs, about the seeded ones."""
    if not spec.compile.search or locked is not None:
        return 0.2  # nothing eager: the step is said and done
    screened = bf16_native and not spec.compile.autocast and not spec.weights.external
    return 1 + (2 * len(SEEDS) if screened else 0)


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


def reduced_precision_refusal(exported: Exported) -> Skipped | None:
    """Why the bfloat16 candidate is not worth compiling here, or None when it is."""
    if exported.spec_file.spec.compile.autocast:
        return Skipped(BF16[0], "the spec's own options already use autocast")
    if exported.spec_file.spec.weights.external:
        return Skipped(
            BF16[0],
            "external weights stay float32 tensors the runtime supplies; "
            "reduced precision needs them folded into the .so",
        )
    if "float32" not in exported.output_dtypes:
        return Skipped(BF16[0], "the model has no float32 output")
    target = exported.target
    if not target.bf16_native():
        return Skipped(BF16[0], target.BF16_SLOW)
    return screen_autocast(exported)


# As the manifest records a tolerance refusal: its diffs differ with the build's threads (a newcomer's
# 1-thread and 2-thread builds made wheels that differed only there); the report has them.
TOLERANCES_REFUSE = "the output tolerances refuse it"


def screen_autocast(exported: Exported) -> Skipped | None:
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
            return Skipped(
                BF16[0], f"eager raised {type(exc).__name__} on case {case.name}, so it could not be screened"
            )
        try:
            with torch.no_grad():
                got = as_tuple(wrapped(*case.inputs), exported.returns_tuple)
        except Exception as exc:  # an op without a bfloat16 kernel, for instance
            return Skipped(
                BF16[0],
                f"eager under {precision.AUTOCAST_DTYPE} autocast raised {type(exc).__name__} "
                f"on case {case.name}: {exc}",
            )
        for name, g, w in zip(names, got, want):
            diff = wheel_compare.compare(name, g, w, *tols[name])
            if not diff.passed:
                return Skipped(
                    BF16[0],
                    f"{TOLERANCES_REFUSE}: eager under {precision.AUTOCAST_DTYPE} autocast, case {case.name}: "
                    f"{diff.describe()}",
                    f"{TOLERANCES_REFUSE}: eager under {precision.AUTOCAST_DTYPE} autocast misses them (the build's "
                    "report has the diffs)",
                )
    return None
