"""A small GPT in plain PyTorch, the model the techniques are demonstrated and tested on:
token and position embeddings, causal attention by matmul + softmax, GeLU or SwiGLU MLPs,
RMSNorm, cross-entropy over characters of a small corpus shipped with the package."""
import math
import os

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """silu(gate) * up, with gate and up the two halves of the input's last dimension. Implements
    stowage's recompute protocol (stowage.torch._known_activations): recomputation writes the
    product straight into the released storage and keeps silu(gate), which the product's
    gradient needs, for backward."""

    def forward(self, x):
        gate, up = x.chunk(2, dim=-1)
        return nn.functional.silu(gate) * up

    def recompute_into(self, out, x):
        gate, up = x.chunk(2, dim=-1)
        silu = nn.functional.silu(gate)
        torch.mul(silu, up, out=out)
        return silu

    def recompute_backward(self, grad, silu, x):
        # What autograd runs through forward's graph: the product's two gradients (grad * other),
        # silu's backward on the gate, and the chunk's (the halves side by side), each written
        # into its half of the input's gradient rather than concatenated from two more tensors.
        gate, up = x.chunk(2, dim=-1)
        if silu is None:
            silu = nn.functional.silu(gate)
        grad_x = torch.empty_like(x)
        grad_gate, grad_up = grad_x.chunk(2, dim=-1)
        torch.mul(grad, silu, out=grad_up)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_gate)
        return (grad_x,)


class Attention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(h // self.heads)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, hidden, ffn, swiglu):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 2 * ffn if swiglu else ffn)
        self.act = SwiGLU() if swiglu else nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, hidden, heads, ffn, swiglu):
        super().__init__()
        self.norm1, self.attn = RMSNorm(hidden), Attention(hidden, heads)
        self.norm2, self.mlp = RMSNorm(hidden), MLP(hidden, ffn, swiglu)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Layers alternate GeLU and SwiGLU MLPs when swiglu="alternate"."""

    def __init__(self, vocab, seq, hidden=64, heads=4, layers=2, ffn=256, swiglu="alternate"):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(seq, hidden)
        kinds = [(i % 2 == 1) if swiglu == "alternate" else bool(swiglu) for i in range(layers)]
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, k) for k in kinds)
        self.norm = RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def corpus():
    """The text the demo trains on (shipped with the package)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt"), encoding="utf-8") as f:
        return f.read()


def batches(text, seq, batch, steps, seed=0):
    """`steps` (input, target) pairs of `batch` windows of `seq` characters, fixed by `seed`;
    and the vocabulary size."""
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, len(ids) - seq - 1, (batch,), generator=g)
        x = torch.stack([ids[s:s + seq] for s in start.tolist()])
        y = torch.stack([ids[s + 1:s + seq + 1] for s in start.tolist()])
        out.append((x, y))
    return out, len(chars)
