#!/usr/bin/python3
"""The gwtf model in PyTorch: the reference for fixtures and benchmarks.

This is the exact definition of issue 5 (train/model.h), written so any
PyTorch user can reproduce gwtf's numbers:

  gpt    h = x + attn.proj(attn(ln1(x)));  y = h + mlp.proj(gelu_tanh(mlp.fc(ln2(h))))
  llama  h = x + attn.o(attn(rope(attn.q(n)), rope(attn.k(n)), attn.v(n))),  n = norm1(x)
         y = h + mlp.down(silu(mlp.gate(m)) * mlp.up(m)),                    m = norm2(h)

Parameter names match gwtf's (blocks.{i}.ln1.weight, ..., tok_emb.weight).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Cfg:
    def __init__(self, arch, d_model, n_heads, n_layers, d_ff, vocab_size=256, max_seq_len=128,
                 eps=1e-5, rope_theta=10000.0):
        self.arch, self.d_model, self.n_heads, self.n_layers = arch, d_model, n_heads, n_layers
        self.d_ff, self.vocab_size, self.max_seq_len = d_ff, vocab_size, max_seq_len
        self.eps, self.rope_theta = eps, rope_theta

    def meta(self):
        return {k: str(getattr(self, k)) for k in
                ("arch", "d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "max_seq_len",
                 "eps", "rope_theta")}


class RMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def causal_attention(q, k, v, n_heads):
    """q, k, v (B,T,C) -> (B,T,C); scale 1/sqrt(head_dim), key t2 > t masked."""
    B, T, C = q.shape
    hd = C // n_heads
    q, k, v = (z.view(B, T, n_heads, hd).transpose(1, 2) for z in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(B, T, C)


def rope_tables(T, hd, theta, dtype, device=None):
    """cos, sin (T, hd/2) of t * theta^(-2i/hd), computed in float64."""
    half = hd // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().to(dtype=dtype, device=device), ang.sin().to(dtype=dtype, device=device)


def rope(x, n_heads, cos, sin):
    """Rotate-half RoPE on (B,T,C): per head, first half / second half of the dims."""
    B, T, C = x.shape
    hd = C // n_heads
    half = hd // 2
    x = x.view(B, T, n_heads, hd)
    c, s = cos[:T, None, :], sin[:T, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).reshape(B, T, C)


class Sub(nn.Module):
    """A named container, so parameters read attn.qkv.weight and so on."""


class GPTBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, Fd = cfg.d_model, cfg.d_ff
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(C, eps=cfg.eps)
        self.attn = Sub()
        self.attn.qkv = nn.Linear(C, 3 * C)
        self.attn.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=cfg.eps)
        self.mlp = Sub()
        self.mlp.fc = nn.Linear(C, Fd)
        self.mlp.proj = nn.Linear(Fd, C)

    def forward(self, x):
        q, k, v = self.attn.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        h = x + self.attn.proj(causal_attention(q, k, v, self.n_heads))
        return h + self.mlp.proj(F.gelu(self.mlp.fc(self.ln2(h)), approximate="tanh"))


class LlamaBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, Fd = cfg.d_model, cfg.d_ff
        self.n_heads = cfg.n_heads
        self.norm1 = RMSNorm(C, cfg.eps)
        self.attn = Sub()
        for name in ("q", "k", "v", "o"):
            setattr(self.attn, name, nn.Linear(C, C, bias=False))
        self.norm2 = RMSNorm(C, cfg.eps)
        self.mlp = Sub()
        self.mlp.gate = nn.Linear(C, Fd, bias=False)
        self.mlp.up = nn.Linear(C, Fd, bias=False)
        self.mlp.down = nn.Linear(Fd, C, bias=False)
        cos, sin = rope_tables(cfg.max_seq_len, C // cfg.n_heads, cfg.rope_theta, torch.float32)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        n = self.norm1(x)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        q = rope(self.attn.q(n), self.n_heads, cos, sin)
        k = rope(self.attn.k(n), self.n_heads, cos, sin)
        h = x + self.attn.o(causal_attention(q, k, self.attn.v(n), self.n_heads))
        m = self.norm2(h)
        return h + self.mlp.down(F.silu(self.mlp.gate(m)) * self.mlp.up(m))


class Blocks(nn.Module):
    """A relay stage: blocks.0 .. blocks.{L-1}."""

    def __init__(self, cfg):
        super().__init__()
        blk = GPTBlock if cfg.arch == "gpt" else LlamaBlock
        self.blocks = nn.ModuleList([blk(cfg) for _ in range(cfg.n_layers)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class Head(nn.Module):
    """The data-node part: embedding, final norm, LM head and mean cross-entropy."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C, V = cfg.d_model, cfg.vocab_size
        self.tok_emb = nn.Embedding(V, C)
        if cfg.arch == "gpt":
            self.pos_emb = nn.Embedding(cfg.max_seq_len, C)
            self.ln_f = nn.LayerNorm(C, eps=cfg.eps)
        else:
            self.norm_f = RMSNorm(C, cfg.eps)
            self.lm_head = nn.Linear(C, V, bias=False)

    def embed(self, tokens):
        x = self.tok_emb(tokens)
        if self.cfg.arch == "gpt":
            x = x + self.pos_emb(torch.arange(tokens.shape[1], device=tokens.device))[None]
        return x

    def loss(self, y, targets):
        if self.cfg.arch == "gpt":
            logits = self.ln_f(y) @ self.tok_emb.weight.t()  # tied head
        else:
            logits = self.lm_head(self.norm_f(y))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
