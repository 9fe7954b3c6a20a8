from torch import nn


class Attention(nn.Module):
    """One self-attention block over a token sequence, as in a vision or text transformer."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm(x) * 1.0 + x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(dim=-1)
        return x + self.out((attn @ v).transpose(1, 2).reshape(b, n, d))


def build():
    return Attention()
