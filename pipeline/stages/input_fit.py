"""What the spec's example inputs tell about a model that rejects them, before anything traces it.

Two causes that a library's own error leaves to guess (issue 30):
- integer inputs drawn past an embedding's end: `IndexError: index out of range in self`. Every
  nn.Embedding is watched while forward runs once; one fed a spec input (the same tensor, a
  view of it, or equal values) is checked against that input's `low`/`high`, whether or not
  the values drawn this time happened to reach past the end;
- a size that differs from the library's config: `The size of tensor a (65) must match the
  size of tensor b (17)`. A transformers model's config names the sizes it was built for
  (`image_size`, `num_channels`, `num_mel_bins`); each is compared with the dim of the spec's
  input that conventionally carries it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import SpecError
from ..spec import SpecFile

# config key -> (rank of the input it sizes, the dims it sizes, the factor from key to size).
# transformers' conventions: pixel_values [batch, channels, height, width], audio
# input_features [batch, mel bins, frames] (frames = 2 x max_source_positions after the convs).
CONFIG_DIMS = {
    "num_channels": (4, (1,), 1),
    "image_size": (4, (2, 3), 1),
    "num_mel_bins": (3, (1,), 1),
    "max_source_positions": (3, (2,), 2),
}


@dataclass(frozen=True)
class Fed:
    input_index: int
    embedding: str  # the module's dotted name
    rows: int


def _is_input(tensor: torch.Tensor, candidate: torch.Tensor) -> bool:
    if candidate.is_floating_point() or tensor.numel() != candidate.numel():
        return False
    if tensor.data_ptr() == candidate.data_ptr():
        return True
    return bool(torch.equal(tensor.reshape(-1).long(), candidate.reshape(-1).long()))


@contextlib.contextmanager
def watching_embeddings(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Iterator[list[Fed]]:
    """Yields a list that fills, while forward runs, with each embedding a spec input feeds."""
    fed: list[Fed] = []

    def hook_for(name: str, rows: int) -> Callable[[torch.nn.Module, tuple[Any, ...]], None]:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            if args and isinstance(args[0], torch.Tensor):
                for index, candidate in enumerate(inputs):
                    if _is_input(args[0], candidate) and all(f.embedding != name for f in fed):
                        fed.append(Fed(index, name, rows))

        return hook

    handles = [
        sub.register_forward_pre_hook(hook_for(name, sub.num_embeddings))
        for name, sub in module.named_modules()
        if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag))
    ]
    try:
        yield fed
    finally:
        for handle in handles:
            handle.remove()


def check_index_ranges(spec_file: SpecFile, fed: list[Fed]) -> None:
    """Each integer input's [low, high) inside the rows of every embedding it indexes."""
    for found in fed:
        spec_input = spec_file.spec.inputs[found.input_index]
        low, high = spec_input.low, spec_input.high
        if low is None or high is None or (low >= 0 and int(high) <= found.rows):
            continue
        raise SpecError(
            f"{spec_file.path}: key 'inputs': input {spec_input.name!r} has low = {low:g}, high = {high:g} (ids "
            f"{int(low)} to {int(high) - 1}), but it indexes {found.embedding}, an embedding of {found.rows} rows "
            f"(ids 0 to {found.rows - 1})",
            f"set low = 0 and high = {found.rows} (or less) in the [[inputs]] table named {spec_input.name!r}: "
            "test and verification inputs are drawn from [low, high), and an id past the end raises "
            "`IndexError: index out of range in self`",
        )


def _configs(module: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    """(dotted path, config) of every transformers-style config the model's modules hold, sub-configs included."""
    seen: set[int] = set()
    for name, sub in module.named_modules():
        config = getattr(sub, "config", None)
        if config is None or id(config) in seen or not hasattr(config, "to_dict"):
            continue
        seen.add(id(config))
        path = f"{name}.config" if name else "config"
        yield path, config
        for key, value in vars(config).items():
            if hasattr(value, "to_dict") and id(value) not in seen:
                seen.add(id(value))
                yield f"{path}.{key}", value


def size_suspects(spec_file: SpecFile, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[str]:
    """Each spec input dim whose size differs from what the model's config says it was built for."""
    suspects = []
    for path, config in _configs(module):
        for key, (rank, dims, factor) in CONFIG_DIMS.items():
            value = getattr(config, key, None)
            if isinstance(value, bool) or not isinstance(value, (int, list, tuple)):
                continue
            wanted = [value] * len(dims) if isinstance(value, int) else list(value)[: len(dims)]
            for spec_input, tensor in zip(spec_file.spec.inputs, inputs):
                if tensor.dim() != rank or not tensor.is_floating_point():
                    continue
                for dim, size in zip(dims, wanted):
                    if isinstance(size, int) and tensor.shape[dim] != size * factor:
                        named = spec_input.shape[dim]
                        suspects.append(
                            f"input {spec_input.name!r} dim {dim}{f' ({named})' if isinstance(named, str) else ''} is "
                            f"{tensor.shape[dim]}, but {path}.{key} = {value!r}"
                            + (f" ({size * factor} expected)" if factor != 1 else "")
                        )
    return list(dict.fromkeys(suspects))
