"""transformers GPT-2: a decoder with learned positions and Conv1D projections, no KV cache."""

from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

# The wrapper `--hf DIR --task …` builds with (docs/library-models.md): one copy of it.
from pipeline.hf_modules import CausalLM as Decoder


def build() -> nn.Module:
    config = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return Decoder(GPT2LMHeadModel(config))
