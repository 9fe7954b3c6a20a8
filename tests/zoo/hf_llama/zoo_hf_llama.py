"""transformers Llama: an LLM-style decoder (RoPE, RMSNorm, grouped-query attention, SwiGLU),
one forward over a prompt, no KV cache."""

from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import CausalLM as Decoder


def build() -> nn.Module:
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Decoder(LlamaForCausalLM(config))
