"""Modules that must fail the build, each for one reason. Used by tests/test_broken_models.py."""

import re

import torch
from torch import nn


class DataDependentBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # branches on a tensor value
            return self.lin(x)
        return -self.lin(x)


class OptionalArgument(nn.Module):
    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale


class VariadicArguments(nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0]


class RandomForward(nn.Module):
    """Exports and compiles, but eager and compiled draw different noise: verification must fail."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.randn_like(x)


class NonTensorArgument(nn.Module):
    def forward(self, x: torch.Tensor, repeats: int) -> torch.Tensor:
        return x.repeat(1, repeats)


class WritesSelf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


class MutatesBufferInHelper(nn.Module):
    """The write hides in a helper, out of the static check's sight: the purity run finds it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(4))

    def _track(self, x: torch.Tensor) -> None:
        self.seen.add_(x.sum(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._track(x)
        return x * 2


class RegexInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.name = "layer_1"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = float(re.sub(r"\D", "", self.name))
        return x * scale


class VersionCheck(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.__version__ >= "2":
            return x.relu()
        return x.clamp(min=0)


class DerivedDataDependent(nn.Module):
    """The branch reads a value computed inside forward: only the dynamic check (dynamo) sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if h.mean() > 0:
            return h
        return -h


class FixedBatchView(nn.Module):
    """Passes the doctor but hard-codes the batch size that the spec declares dynamic: export fails."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(2, 2, 2).sum(-1)
