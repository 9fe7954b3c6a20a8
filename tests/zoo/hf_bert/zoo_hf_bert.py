"""transformers BERT encoder: token ids and an attention mask in, hidden states out."""

import torch
from transformers import BertConfig, BertModel
from torch import nn


class Encoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build() -> nn.Module:
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)
    return Encoder(BertModel(config, add_pooling_layer=False))
