"""Fused MLP activations.

bias_gelu(x, bias) = F.gelu(x + bias) with the exact erf GELU (nn.GELU()'s
default).  Forward fuses the bias add into the activation; backward recomputes
z = x + bias (cheaper than saving it) and produces dx and dbias in one pass:
a persistent grid of row programs keeps per-program column sums of dx that
torch reduces, as in the LayerNorm backward.

swiglu(a, b) = F.silu(a) * b (the LLaMA-style gated MLP), fused both ways.
"""

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import NAMESPACE, acc_dtype, interpreting, launch, maybe_autotune, num_programs, tl, triton

INTERPRET_META = {"BLOCK_M": 4, "BLOCK_N": 16}


def bias_gelu_torch(x: Tensor, bias: Tensor) -> Tensor:
    """Reference path: exact (erf) GELU of the biased input."""
    return F.gelu(x + bias)


def swiglu_torch(a: Tensor, b: Tensor) -> Tensor:
    return F.silu(a) * b


def _configs():
    # Elementwise and memory-bound: wide column tiles for coalescing, a few
    # rows per program; warps scale with the tile.
    # The configs an H100 chose at widths 3072-16384 (kernels/NOTES.md); the first
    # is the default when autotuning is off.
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w)
        for bm, bn, w in ((8, 256, 4), (16, 256, 8), (32, 128, 4), (1, 1024, 4))
    ]


def _flat_configs():
    return [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((2048, 8), (1024, 4), (4096, 8))]


@functools.cache
def _triton_kernels(interpret: bool):
    @triton.jit
    def bias_gelu_fwd_kernel(
        X, B, Y, M, N, stride_x, stride_y, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        b = tl.load(B + cols, mask=cols < N, other=0.0).to(ACC)
        z = x + b[None, :]
        y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def bias_gelu_bwd_kernel(
        DY,
        X,
        B,
        DX,
        DB,
        M,
        N,
        stride_dy,
        stride_x,
        stride_dx,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)
        db = tl.zeros((BLOCK_N,), ACC)
        # Row tiles pid_m, pid_m + P, ...: a fixed number P of programs per
        # column tile keeps the partial-dbias buffer (P, N) independent of BLOCK_M.
        for start in range(pid_m * BLOCK_M, M, tl.num_programs(0) * BLOCK_M):
            rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows[:, None] < M) & col_ok[None, :]
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
            z = x + b[None, :]
            cdf = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
            pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327  # 1/sqrt(2*pi)
            dz = dy * (cdf + z * pdf)  # 0 on masked lanes since dy = 0 there
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dz.to(DX.dtype.element_ty), mask=mask)
            db += tl.sum(dz, axis=0)
        tl.store(DB + pid_m * N + cols, db, mask=col_ok)

    @triton.jit
    def swiglu_fwd_kernel(A, B, Y, numel, ACC: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        a = tl.load(A + offs, mask=mask, other=0.0).to(ACC)
        b = tl.load(B + offs, mask=mask, other=0.0).to(ACC)
        y = a * tl.sigmoid(a) * b
        tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def swiglu_bwd_kernel(DY, A, B, DA, DB, numel, ACC: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(ACC)
        a = tl.load(A + offs, mask=mask, other=0.0).to(ACC)
        b = tl.load(B + offs, mask=mask, other=0.0).to(ACC)
        sig = tl.sigmoid(a)
        silu = a * sig
        tl.store(DA + offs, (dy * b * (sig + silu * (1.0 - sig))).to(DA.dtype.element_ty), mask=mask)
        tl.store(DB + offs, (dy * silu).to(DB.dtype.element_ty), mask=mask)

    return SimpleNamespace(
        gelu_fwd=maybe_autotune(bias_gelu_fwd_kernel, _configs(), ["N"], interpret),
        gelu_bwd=maybe_autotune(bias_gelu_bwd_kernel, _configs(), ["N"], interpret),
        swiglu_fwd=maybe_autotune(swiglu_fwd_kernel, _flat_configs(), ["numel"], interpret),
        swiglu_bwd=maybe_autotune(swiglu_bwd_kernel, _flat_configs(), ["numel"], interpret),
    )


# --- custom ops: opaque to torch.compile, shapes given by the fake kernels ---


@torch.library.custom_op(f"{NAMESPACE}::bias_gelu_fwd", mutates_args=())
def bias_gelu_fwd(x: Tensor, bias: Tensor) -> Tensor:
    m, n = x.shape
    y = torch.empty_like(x)
    if m == 0 or n == 0:
        return y
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
    launch(
        _triton_kernels(interpreting()).gelu_fwd,
        grid,
        x,
        bias,
        y,
        m,
        n,
        x.stride(0),
        y.stride(0),
        ACC=acc_dtype(x.dtype),
        interp_meta=INTERPRET_META,
    )
    return y


@bias_gelu_fwd.register_fake
def _(x, bias):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::bias_gelu_bwd", mutates_args=())
def bias_gelu_bwd(dy: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    m, n = x.shape
    dx = torch.empty_like(x)
    programs = num_programs(x.device, m)
    part = x.new_zeros((programs, n), dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    if m > 0 and n > 0:
        grid = lambda meta: (programs, triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
        launch(
            _triton_kernels(interpreting()).gelu_bwd,
            grid,
            dy,
            x,
            bias,
            dx,
            part,
            m,
            n,
            dy.stride(0),
            x.stride(0),
            dx.stride(0),
            ACC=acc_dtype(x.dtype),
            interp_meta=INTERPRET_META,
        )
    return dx, part.sum(0).to(bias.dtype)


@bias_gelu_bwd.register_fake
def _(dy, x, bias):
    return torch.empty_like(x), torch.empty_like(bias)


class BiasGeluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(x2, bias)
        return bias_gelu_fwd(x2, bias).view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, bias = ctx.saved_tensors
        dx, dbias = bias_gelu_bwd(dy.reshape(x2.shape).contiguous(), x2, bias)
        return dx.view(dy.shape), dbias


def bias_gelu_triton(x: Tensor, bias: Tensor) -> Tensor:
    if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"kernels.bias_gelu: bias must have shape ({x.shape[-1]},)")
    if bias.dtype != x.dtype:  # same type promotion as x + bias
        dtype = torch.promote_types(x.dtype, bias.dtype)
        x, bias = x.to(dtype), bias.to(dtype)
    return BiasGeluFunction.apply(x, bias.contiguous())


@torch.library.custom_op(f"{NAMESPACE}::swiglu_fwd", mutates_args=())
def swiglu_fwd(a: Tensor, b: Tensor) -> Tensor:
    y = torch.empty_like(a)
    if a.numel():
        launch(
            _triton_kernels(interpreting()).swiglu_fwd,
            lambda meta: (triton.cdiv(a.numel(), meta["BLOCK"]),),
            a,
            b,
            y,
            a.numel(),
            ACC=acc_dtype(a.dtype),
            interp_meta={"BLOCK": 64},
        )
    return y


@swiglu_fwd.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op(f"{NAMESPACE}::swiglu_bwd", mutates_args=())
def swiglu_bwd(dy: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    da, db = torch.empty_like(a), torch.empty_like(b)
    if a.numel():
        launch(
            _triton_kernels(interpreting()).swiglu_bwd,
            lambda meta: (triton.cdiv(a.numel(), meta["BLOCK"]),),
            dy,
            a,
            b,
            da,
            db,
            a.numel(),
            ACC=acc_dtype(a.dtype),
            interp_meta={"BLOCK": 64},
        )
    return da, db


@swiglu_bwd.register_fake
def _(dy, a, b):
    return torch.empty_like(a), torch.empty_like(b)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return swiglu_fwd(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return swiglu_bwd(dy.contiguous(), a, b)


def swiglu_triton(a: Tensor, b: Tensor) -> Tensor:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError("kernels.swiglu: a and b must have the same shape and dtype")
    return SwiGLUFunction.apply(a.contiguous(), b.contiguous())
