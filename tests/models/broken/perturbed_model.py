"""A correct module whose *compiled* output is deliberately scaled by 1.01.

Importing this file registers an Inductor post-grad pass (real compiler machinery, nothing
mocked) that multiplies every graph output by 1.01, so verification must catch the 1% error.
"""

import torch
import torch._inductor.config as inductor_config
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass


class ScaleOutputs(CustomGraphPass):
    def __call__(self, graph: torch.fx.Graph) -> None:
        output = graph.find_nodes(op="output")[0]
        scaled = []
        with graph.inserting_before(output):
            for value in output.args[0]:
                node = graph.call_function(torch.ops.aten.mul.Tensor, (value, 1.01))
                node.meta["val"] = value.meta["val"]
                scaled.append(node)
        output.args = (tuple(scaled),)

    def uuid(self) -> str:
        return "tests-scale-outputs-1.01"


inductor_config.post_grad_custom_post_pass = ScaleOutputs()


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)
