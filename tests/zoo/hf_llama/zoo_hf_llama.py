"""transformers Llama: an LLM-style decoder (RoPE, RMSNorm, grouped-query attention, SwiGLU),
one forward over a prompt, no KV cache."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from torch import nn


class Decoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def build() -> nn.Module:
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Decoder(LlamaForCausalLM(config))
