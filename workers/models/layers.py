"""Transformer building blocks shared by the ViT and GPT models.

Every op that has a custom kernel goes through the `kernels` package, so one
config field (`kernels: {op: impl}`) switches implementations without touching
model code. "auto" and "torch" are numerically the built-in ops.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import kernels

KERNEL_OPS: tuple[str, ...] = kernels.OPS  # the ops a config's `kernels` dict may name
KERNEL_IMPLS: tuple[str, ...] = kernels.IMPLS


class LayerNorm(nn.Module):
    """nn.LayerNorm's parameters and math, computed by kernels.layer_norm."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, impl: str = "auto"):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.layer_norm(x, self.weight, self.bias, self.eps, impl=self.impl)


class Attention(nn.Module):
    """Multi-head self-attention: one fused qkv Linear, kernels.attention, output proj."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        bias: bool = True,
        causal: bool = False,
        dropout: float = 0.0,
        impl: str = "auto",
    ):
        super().__init__()
        assert dim % n_heads == 0, f"dim {dim} not divisible by n_heads {n_heads}"
        self.n_heads = n_heads
        self.causal = causal
        self.impl = impl
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        # kernels.attention has no dropout argument: only the residual path drops
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> 3 x (B, heads, T, head_dim)
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = kernels.attention(q, k, v, causal=self.causal, impl=self.impl)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.drop(self.proj(y))


class MLP(nn.Module):
    """fc1 -> GELU -> fc2.

    With `gelu_impl` "torch" or "triton" the bias add and GELU of fc1 run as one
    kernels.bias_gelu call (fc1's weight is applied with F.linear, so a module
    swap of fc1, e.g. to fp8, does not apply to it). "auto" keeps plain
    Linear + GELU, the same math, so fc1 stays an ordinary nn.Linear that fp8
    conversion and torch.compile's addmm fusion can work on.
    Parameters are identical either way, so checkpoints are interchangeable.
    """

    def __init__(
        self, dim: int, hidden: int, bias: bool = True, dropout: float = 0.0, gelu_impl: str = "auto"
    ):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.fused = gelu_impl != "auto" and bias
        self.gelu_impl = gelu_impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            h = kernels.bias_gelu(F.linear(x, self.fc1.weight), self.fc1.bias, impl=self.gelu_impl)
        else:
            h = F.gelu(self.fc1(x))
        return self.drop(self.fc2(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)); x + mlp(ln(x))."""

    def __init__(
        self,
        dim: int,
        n_heads: int,
        mlp_hidden: int,
        *,
        bias: bool = True,
        causal: bool = False,
        dropout: float = 0.0,
        eps: float = 1e-5,
        kernels: dict[str, str] | None = None,
    ):
        super().__init__()
        impl = (kernels or {}).get
        self.ln1 = LayerNorm(dim, eps, bias, impl("layer_norm", "auto"))
        self.attn = Attention(dim, n_heads, bias, causal, dropout, impl("attention", "auto"))
        self.ln2 = LayerNorm(dim, eps, bias, impl("layer_norm", "auto"))
        self.mlp = MLP(dim, mlp_hidden, bias, dropout, impl("bias_gelu", "auto"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
