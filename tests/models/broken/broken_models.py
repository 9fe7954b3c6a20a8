"""Modules that must fail the build, each for one reason. Used by tests/test_failures.py."""

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
