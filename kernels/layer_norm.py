"""Fused LayerNorm (weight + bias) over the last dimension.

Forward: one program per tile of BLOCK_M whole rows, held in registers, fp32
statistics (fp64 for fp64 inputs); mean and rstd are saved for the backward.
Backward: a persistent grid (one program per SM) walks strided tiles of rows,
writes dx and keeps running dw/db sums in registers; each program stores its
partial sums to a (programs, N) buffer that torch reduces (the scheme of the
Triton layer-norm tutorial and Liger-Kernel, with multi-row tiles so that short
rows still keep enough loads in flight).
"""

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import (
    NAMESPACE,
    acc_dtype,
    interpreting,
    launch,
    maybe_autotune,
    next_power_of_2,
    num_programs,
    tl,
    triton,
)

# A row is held in one block; beyond 64 KiB per row it would spill registers.
MAX_ROW_BYTES = 65536


def layer_norm_torch(x: Tensor, weight, bias, eps: float = 1e-5) -> Tensor:
    """Reference path: the built-in op."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


# Tiles hold at most this many elements (BLOCK_M rows x BLOCK_N columns).
MAX_TILE = 16384
# Under the interpreter: two-row tiles, so row tails and multi-row tiles are tested.
INTERPRET_META = {"BLOCK_M": 2}


def _configs():
    # A tile is BLOCK_M whole rows.  Short rows (ViT/GPT-2: 768) need several
    # rows per program to keep enough loads in flight; long rows want fewer rows
    # and more warps.  (BLOCK_M, warps): the configs an H100 chose at rows of
    # 768-4096 (kernels/NOTES.md), plus one-row tiles for longer rows.  The first
    # surviving config is the default when autotuning is off (KERNELS_AUTOTUNE=0).
    return [
        triton.Config({"BLOCK_M": bm}, num_warps=w)
        for bm, w in ((4, 4), (8, 4), (2, 4), (8, 8), (2, 16), (4, 16), (1, 8), (1, 16))
    ]


def _prune(configs, nargs, **kwargs):
    """Drop tiles larger than MAX_TILE elements and warps with under one row each."""
    block_n = kwargs["BLOCK_N"]
    return [
        c
        for c in configs
        if c.kwargs["BLOCK_M"] * block_n <= MAX_TILE and c.num_warps * 32 <= c.kwargs["BLOCK_M"] * block_n
    ]


@functools.cache
def _triton_kernels(interpret: bool):
    @triton.jit
    def layer_norm_fwd_kernel(
        X,
        Y,
        W,
        B,
        Mean,
        Rstd,
        stride_x,
        stride_y,
        M,
        N,
        eps,
        BLOCK_N: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
    ):
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        mask = row_ok[:, None] & col_ok[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / N
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
        b = tl.load(B + cols, mask=col_ok, other=0.0).to(ACC)
        y = xc * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
        tl.store(Mean + rows, mean, mask=row_ok)
        tl.store(Rstd + rows, rstd, mask=row_ok)

    @triton.jit
    def layer_norm_bwd_kernel(
        DY,
        X,
        W,
        Mean,
        Rstd,
        DX,
        DW,
        DB,
        stride_dy,
        stride_x,
        stride_dx,
        M,
        N,
        BLOCK_N: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_N)
        col_ok = cols < N
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(ACC)
        dw = tl.zeros((BLOCK_N,), dtype=ACC)
        db = tl.zeros((BLOCK_N,), dtype=ACC)
        # Row tiles pid, pid + P, ...: the (P, N) partial-sum buffer does not
        # depend on the autotuned BLOCK_M.
        for start in range(pid * BLOCK_M, M, tl.num_programs(0) * BLOCK_M):
            rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)
            row_ok = rows < M
            mask = row_ok[:, None] & col_ok[None, :]
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(ACC)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(ACC)
            mean = tl.load(Mean + rows, mask=row_ok, other=0.0)
            rstd = tl.load(Rstd + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            wdy = w[None, :] * dy
            # dx = rstd * (w*dy - mean(w*dy) - xhat * mean(xhat*w*dy))
            c1 = tl.sum(xhat * wdy, axis=1) / N
            c2 = tl.sum(wdy, axis=1) / N
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            dw += tl.sum(dy * xhat, axis=0)
            db += tl.sum(dy, axis=0)
        tl.store(DW + pid * N + cols, dw, mask=col_ok)
        tl.store(DB + pid * N + cols, db, mask=col_ok)

    prune = {"early_config_prune": _prune}
    return SimpleNamespace(
        fwd=maybe_autotune(layer_norm_fwd_kernel, _configs(), ["N"], interpret, prune_configs_by=prune),
        bwd=maybe_autotune(layer_norm_bwd_kernel, _configs(), ["N"], interpret, prune_configs_by=prune),
    )


def _block_n(x: Tensor) -> int:
    n = x.shape[-1]
    if n * x.element_size() > MAX_ROW_BYTES:
        raise ValueError(
            f"kernels.layer_norm: triton path supports rows up to "
            f"{MAX_ROW_BYTES} bytes, got {n} x {x.element_size()}"
        )
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
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)  # noqa: E731
    launch(
        kern.fwd,
        grid,
        x,
        y,
        weight,
        bias,
        mean,
        rstd,
        x.stride(0),
        y.stride(0),
        m,
        n,
        eps,
        BLOCK_N=_block_n(x),
        ACC=acc_dtype(x.dtype),
        interp_meta=INTERPRET_META,
    )
    return y, mean, rstd


@layer_norm_fwd.register_fake
def _(x, weight, bias, eps):
    stats = x.new_empty((x.shape[0],), dtype=_stat_dtype(x))
    return torch.empty_like(x), stats, torch.empty_like(stats)


@torch.library.custom_op(f"{NAMESPACE}::layer_norm_bwd", mutates_args=())
def layer_norm_bwd(
    dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    m, n = x.shape
    dx = torch.empty_like(x)
    programs = num_programs(x.device, m)
    part_w = x.new_zeros((programs, n), dtype=mean.dtype)
    part_b = torch.zeros_like(part_w)
    if m > 0:
        kern = _triton_kernels(interpreting())
        launch(
            kern.bwd,
            (programs,),
            dy,
            x,
            weight,
            mean,
            rstd,
            dx,
            part_w,
            part_b,
            dy.stride(0),
            x.stride(0),
            dx.stride(0),
            m,
            n,
            BLOCK_N=_block_n(x),
            ACC=acc_dtype(x.dtype),
            interp_meta=INTERPRET_META,
        )
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
        dx, dw, db = layer_norm_bwd(dy.reshape(x2.shape).contiguous(), x2, weight, mean, rstd)
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
