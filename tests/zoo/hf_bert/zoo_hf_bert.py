"""transformers BERT encoder: token ids and an attention mask in, hidden states out."""

from torch import nn
from transformers import BertConfig, BertModel

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import TextEncoder as Encoder


def build() -> nn.Module:
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return Encoder(BertModel(config, add_pooling_layer=False))
