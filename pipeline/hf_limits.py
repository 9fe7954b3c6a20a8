"""A text checkpoint's sequence limits, read from its config.json before export (issues 44, 46).

Two limits decide which `[dims.sequence]` range torch.export can capture:
- the position table (`max_position_embeddings` and its other names): a longer sequence indexes
  past it, so export's guard caps the dim there;
- a sliding window (`sliding_window`, Mistral-style decoders): the attention mask takes one path
  for sequences shorter than the window and another from the window on, and one exported graph
  holds one of them. From the window on works (measured: window 16, [16, 2048] exports; [1, 15]
  and [15, 64] do not; [1, 14] does), and is what an embedder of long texts needs.
The generated spec picks a range inside both; an override that leaves them is refused here,
naming the config key, its value and the override that works, instead of torch's
"Constraints violated" after export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import SpecError

# A text model's sequence bound is its max positions, capped: verify runs every dim at its max,
# and Llama 3's 131072 positions would need an attention matrix no build machine holds.
MAX_SEQUENCE = 2048
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
SEQUENCE = "sequence"  # the dim the text tasks' inputs name


def position_limit(config: dict[str, Any]) -> tuple[str, int] | None:
    """(config key, value) of the position table's size, or None where the config gives none."""
    for key in POSITION_KEYS:
        if isinstance(config.get(key), int) and not isinstance(config[key], bool) and config[key] > 0:
            return key, config[key]
    return None


def sliding_window(config: dict[str, Any]) -> int | None:
    """The attention window, where the model uses one (Qwen2 keeps a window it does not use)."""
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or isinstance(window, bool) or not isinstance(window, int):
        return None
    return window if window > 1 else None


def max_positions(config: dict[str, Any]) -> int:
    limit = position_limit(config)
    return min(limit[1], MAX_SEQUENCE) if limit else MAX_SEQUENCE


def sequence_dim(config: dict[str, Any]) -> dict[str, int]:
    """The generated [dims.sequence]: 1 to the positions (capped), from the window on where one is shorter."""
    bound = max_positions(config)
    window = sliding_window(config)
    if window is not None and window < bound:
        return {"min": window, "max": bound, "example": window}
    return {"min": 1, "max": bound, "example": min(16, bound)}


def _working(low: int, high: int, config: dict[str, Any]) -> tuple[int, int]:
    """The range nearest to [low, high] that both limits allow."""
    high = min(high, max_positions(config))
    window = sliding_window(config)
    if window is not None and low < window <= high + 1:
        if high >= window:
            return window, high  # from the window on: the long texts asked for
        return min(low, window - 2), window - 2  # all below it, where the short path holds
    return min(low, high), high


def _dim_lines(low: int, high: int) -> str:
    return f"[dims.{SEQUENCE}]\n    min = {low}\n    max = {high}"


def check_sequence(dims: dict[str, Any], given: Any, config: dict[str, Any], config_file: Path, where: str) -> None:
    """Refuse a [dims.sequence] (the generated one merged with the user's, ``given``) that the
    config's limits rule out. A user's max under the generated min (the window's) with no min of
    their own asks for short sequences: those start at 1, below the window."""
    dim = dims.get(SEQUENCE)
    if not isinstance(dim, dict) or not all(isinstance(dim.get(k), int) for k in ("min", "max")):
        return  # no sequence dim, or one the spec's own validation will refuse
    if isinstance(given, dict) and "min" not in given and dim["max"] < dim["min"]:
        dim["min"] = 1
    low, high = dim["min"], dim["max"]
    limit, window = position_limit(config), sliding_window(config)
    problem = None
    if limit is not None and high > limit[1]:
        problem = (
            f"key 'dims.{SEQUENCE}.max': {high} is over the checkpoint's {limit[0]} = {limit[1]} "
            f"({config_file}): the model has positions for {limit[1]} tokens, so it cannot take a longer sequence"
        )
    elif window is not None and low < window and high > window - 2:
        problem = (
            f"key 'dims.{SEQUENCE}.min': the range [{low}, {high}] crosses the checkpoint's sliding_window = "
            f"{window} ({config_file}): the attention mask is made one way for sequences shorter than the window "
            f"and another from {window} tokens on, and one compiled model holds one of them"
        )
    if problem is None:
        return
    good_low, good_high = _working(low, high, config)
    raise SpecError(
        f"{where}: {problem}",
        f"use this range in the override spec (--spec), which builds:\n    {_dim_lines(good_low, good_high)}",
    )
