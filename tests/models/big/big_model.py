"""Large tables, little compute: 2.46 GB of float32 weights (3 tables of 200,000 x 1024)."""

import torch
from torch import nn


class Tables(nn.Module):
    def __init__(self, rows: int = 200_000, dim: int = 1024, tables: int = 3) -> None:
        super().__init__()
        self.tables = nn.ParameterList(nn.Parameter(torch.randn(rows, dim) * 0.02) for _ in range(tables))
        self.head = nn.Linear(dim, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pooled = torch.zeros(ids.shape[0], self.head.in_features, dtype=self.head.weight.dtype)
        for table in self.tables:
            pooled = pooled + table[ids].mean(dim=1)
        return self.head(pooled)
