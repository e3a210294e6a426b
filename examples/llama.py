"""A small byte-level Llama-style transformer: RMSNorm, rotary embeddings, SwiGLU, untied embeddings.

Used by the examples through ``torch.func.functional_call``, so its parameters can live in a
plain dict that dash_fn steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 256  # bytes
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: int = 344  # SwiGLU width, about 8/3 of d_model
    context: int = 128
    experts: int = 0  # > 0: a mixture-of-experts feed-forward of this many SwiGLU experts


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(context: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of position * frequency, frequencies 10000^(-2i/head_dim)."""
    freqs = 10000.0 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.arange(context).float()[:, None] * freqs[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate consecutive pairs (x_2i, x_2i+1) by the position's angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Experts(nn.Module):
    """E SwiGLU experts of width ``mlp_hidden // E``, mixed by a softmax router (every token
    goes to every expert, weighted). The experts' weights are stacked: ``w_gate_up`` is
    (E, d_model, 2 h) and ``w_down`` (E, h, d_model), the batched form to declare to DASH with
    ``batch_dims=1`` so that each expert is preconditioned on its own."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        hidden = c.mlp_hidden // c.experts
        self.router = nn.Linear(c.d_model, c.experts, bias=False)
        self.w_gate_up = nn.Parameter(torch.empty(c.experts, c.d_model, 2 * hidden))
        self.w_down = nn.Parameter(torch.empty(c.experts, hidden, c.d_model))
        for w in (self.w_gate_up, self.w_down):
            nn.init.normal_(w, std=0.02)

    def forward(self, x):
        weights = F.softmax(self.router(x), dim=-1)  # (B, T, E)
        gate, up = torch.einsum("btd,edh->bteh", x, self.w_gate_up).chunk(2, dim=-1)
        y = torch.einsum("bteh,ehd->bted", F.silu(gate) * up, self.w_down)
        return torch.einsum("bted,bte->btd", y, weights)


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.attn_norm = RMSNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.proj = nn.Linear(c.d_model, c.d_model, bias=False)
        self.mlp_norm = RMSNorm(c.d_model)
        if c.experts:
            self.moe = Experts(c)
        else:
            self.gate_up = nn.Linear(c.d_model, 2 * c.mlp_hidden, bias=False)
            self.down = nn.Linear(c.mlp_hidden, c.d_model, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.n_heads, D // self.n_heads).unbind(2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        if hasattr(self, "moe"):
            return x + self.moe(self.mlp_norm(x))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)  # untied from the embedding
        cos, sin = rotary_tables(c.context, c.d_model // c.n_heads)
        self.register_buffer("cos", cos[:, None, :], persistent=False)
        self.register_buffer("sin", sin[:, None, :], persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.embed(tokens)
        cos, sin = self.cos[:T], self.sin[:T]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def expert_weights(names) -> dict[str, int]:
    """``batch_dims`` for DASH: the stacked expert weights' leading dim indexes experts."""
    return {name: 1 for name in names if name.endswith((".moe.w_gate_up", ".moe.w_down"))}


def next_byte_loss(model: Llama, params: dict, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting tokens[:, 1:] from tokens[:, :-1]."""
    logits = torch.func.functional_call(model, params, (tokens[:, :-1],))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
