"""Fused LayerNorm (weight + bias) over the last dimension.

Forward: one program per row, the whole row in registers, fp32 statistics
(fp64 for fp64 inputs); mean and rstd are saved for the backward.
Backward: a persistent grid (one program per SM) walks a contiguous slice of
rows, writes dx per row and keeps running dw/db sums in registers; each program
stores its partial sums to a (programs, N) buffer that torch reduces
(the scheme of the Triton layer-norm tutorial and Liger-Kernel).
"""
import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (NAMESPACE, acc_dtype, launch, maybe_autotune, next_power_of_2,
                      num_programs, interpreting, tl, triton)

# A row is held in one block; beyond 64 KiB per row it would spill registers.
MAX_ROW_BYTES = 65536


def layer_norm_torch(x: Tensor, weight, bias, eps: float = 1e-5) -> Tensor:
    """Reference path: the built-in op."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _configs():
    # The block is the whole row, so only the warp count is tunable; 16 warps
    # pays off for rows of 8K+ elements on Hopper, 1-2 for rows < 1K.
    return [triton.Config({}, num_warps=w) for w in (1, 2, 4, 8, 16)]


@functools.cache
def _triton_kernels(interpret: bool):
    @triton.jit
    def layer_norm_fwd_kernel(X, Y, W, B, Mean, Rstd, stride_x, stride_y, N, eps,
            BLOCK_N: tl.constexpr, ACC: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(ACC)
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(mask, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(ACC)
        b = tl.load(B + cols, mask=mask, other=0.0).to(ACC)
        y = xc * rstd * w + b
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
        tl.store(Mean + row, mean)
        tl.store(Rstd + row, rstd)

    @triton.jit
    def layer_norm_bwd_kernel(DY, X, W, Mean, Rstd, DX, DW, DB, stride_dy, stride_x, stride_dx,
            M, N, rows_per_program, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        mask = cols < N
        w = tl.load(W + cols, mask=mask, other=0.0).to(ACC)
        dw = tl.zeros((BLOCK_N,), dtype=ACC)
        db = tl.zeros((BLOCK_N,), dtype=ACC)
        row_start = pid.to(tl.int64) * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, M)
        for row in range(row_start, row_end):
            x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(ACC)
            mean = tl.load(Mean + row)
            rstd = tl.load(Rstd + row)
            xhat = tl.where(mask, (x - mean) * rstd, 0.0)
            wdy = w * dy
            # dx = rstd * (w*dy - mean(w*dy) - xhat * mean(xhat*w*dy))
            c1 = tl.sum(xhat * wdy, axis=0) / N
            c2 = tl.sum(wdy, axis=0) / N
            dx = (wdy - (xhat * c1 + c2)) * rstd
            tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw += dy * xhat
            db += dy
        tl.store(DW + pid * N + cols, dw, mask=mask)
        tl.store(DB + pid * N + cols, db, mask=mask)

    return SimpleNamespace(
        fwd=maybe_autotune(layer_norm_fwd_kernel, _configs(), ["N"], interpret),
        bwd=maybe_autotune(layer_norm_bwd_kernel, _configs(), ["N"], interpret),
    )


def _block_n(x: Tensor) -> int:
    n = x.shape[-1]
    if n * x.element_size() > MAX_ROW_BYTES:
        raise ValueError(f"kernels.layer_norm: triton path supports rows up to "
                         f"{MAX_ROW_BYTES} bytes, got {n} x {x.element_size()}")
    return next_power_of_2(n)


def _stat_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# --- custom ops: opaque to torch.compile, shapes given by the fake kernels ---

@torch.library.custom_op(f"{NAMESPACE}::layer_norm_fwd", mutates_args=())
def layer_norm_fwd(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    m, n = x.shape
    y = torch.empty_like(x)
    mean = x.new_empty((m,), dtype=_stat_dtype(x))
    rstd = torch.empty_like(mean)
    if m == 0:
        return y, mean, rstd
    kern = _triton_kernels(interpreting())
    launch(kern.fwd, (m,), x, y, weight, bias, mean, rstd, x.stride(0), y.stride(0), n, eps,
           BLOCK_N=_block_n(x), ACC=acc_dtype(x.dtype), interp_meta={})
    return y, mean, rstd


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty((x.shape[0],), dtype=_stat_dtype(x))
    return torch.empty_like(x), stats, torch.empty_like(stats)


@torch.library.custom_op(f"{NAMESPACE}::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                   rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    m, n = x.shape
    dx = torch.empty_like(x)
    programs = num_programs(x.device, m)
    part_w = x.new_zeros((programs, n), dtype=mean.dtype)
    part_b = torch.zeros_like(part_w)
    if m > 0:
        rows_per_program = triton.cdiv(m, programs)
        kern = _triton_kernels(interpreting())
        launch(kern.bwd, (programs,), dy, x, weight, mean, rstd, dx, part_w, part_b,
               dy.stride(0), x.stride(0), dx.stride(0), m, n, rows_per_program,
               BLOCK_N=_block_n(x), ACC=acc_dtype(x.dtype), interp_meta={})
    return dx, part_w.sum(0).to(weight.dtype), part_b.sum(0).to(weight.dtype)


@layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        y, mean, rstd = layer_norm_fwd(x2, weight, bias, eps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_bwd(
            dy.reshape(x2.shape).contiguous(), x2, weight, mean, rstd)
        return dx.view(dy.shape), dw, db, None


def layer_norm_triton(x: Tensor, weight, bias, eps: float = 1e-5) -> Tensor:
    n = x.shape[-1]
    # Missing affine params become constants; their gradients are dropped.
    if weight is None:
        weight = x.new_ones(n)
    if bias is None:
        bias = x.new_zeros(n)
    if weight.shape != (n,) or bias.shape != (n,):
        raise ValueError(f"kernels.layer_norm: weight/bias must have shape ({n},)")
    return LayerNormFunction.apply(x, weight.contiguous(), bias.contiguous(), eps)
