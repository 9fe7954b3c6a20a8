"""transformers GPT-2: a decoder with learned positions and Conv1D projections, no KV cache."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from torch import nn


class Decoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build() -> nn.Module:
    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return Decoder(GPT2LMHeadModel(config))
