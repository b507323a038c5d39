"""The Triton source of cross_entropy.py: its `@triton.jit` kernels, the row kernel (loss
and lse; with WRITE_GRAD, the gradient in place), the backward row kernel, and the in-place
scale of a saved gradient; the formulas are in cross_entropy.py's docstring.

`jit_kernels()` decorates them when it is called: `cross_entropy._triton_kernels(interpret)`
calls it at the first launch, so TRITON_INTERPRET is read then (see _common.py), and wraps
them in cross_entropy.py's autotune configs.
"""

from types import SimpleNamespace

from ._common import tl, triton


def jit_kernels() -> SimpleNamespace:
    """The kernels, decorated now (call it at the first launch, never at import)."""

    @triton.jit
    def cross_entropy_fwd_kernel(
        LOGITS,
        TARGET,
        LOSS,
        LSE,
        GRAD_SCALE,
        stride,
        V,
        ignore_index,
        smoothing,
        WRITE_GRAD: tl.constexpr,
        ACC: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        base = LOGITS + row * stride
        t = tl.load(TARGET + row)
        m = tl.full((), float("-inf"), ACC)
        s = tl.zeros((), ACC)
        x_sum = tl.zeros((), ACC)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(ACC)
            m_new = tl.maximum(m, tl.max(x, axis=0))  # finite: chunk 0 has a real column
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            x_sum += tl.sum(tl.where(cols < V, x, 0.0), axis=0)
            m = m_new
        lse = m + tl.log(s)
        ignored = t == ignore_index
        x_t = tl.load(base + t, mask=t != ignore_index, other=0.0).to(ACC)
        loss = lse - (1.0 - smoothing) * x_t - smoothing * x_sum / V
        tl.store(LOSS + row, tl.where(ignored, 0.0, loss))
        tl.store(LSE + row, lse)
        if WRITE_GRAD:  # second pass over this row: logits -> d(loss)/d(logits)
            g = tl.where(ignored, 0.0, tl.load(GRAD_SCALE).to(ACC))
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                x = tl.load(base + cols, mask=cols < V, other=0.0).to(ACC)
                grad = tl.exp(x - lse) - smoothing / V - tl.where(cols == t, 1.0 - smoothing, 0.0)
                tl.store(base + cols, (grad * g).to(LOGITS.dtype.element_ty), mask=cols < V)

    @triton.jit
    def cross_entropy_bwd_kernel(
        LOGITS,
        TARGET,
        LSE,
        DLOGITS,
        GRAD_SCALE,
        stride,
        dstride,
        V,
        ignore_index,
        smoothing,
        ACC: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        t = tl.load(TARGET + row)
        lse = tl.load(LSE + row)
        g = tl.where(t == ignore_index, 0.0, tl.load(GRAD_SCALE).to(ACC))
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(LOGITS + row * stride + cols, mask=cols < V, other=0.0).to(ACC)
            grad = tl.exp(x - lse) - smoothing / V - tl.where(cols == t, 1.0 - smoothing, 0.0)
            tl.store(DLOGITS + row * dstride + cols, (grad * g).to(DLOGITS.dtype.element_ty), mask=cols < V)

    @triton.jit
    def scale_kernel(X, SCALE, numel, BLOCK: tl.constexpr):
        # x *= scale, read on the device; a no-op (no memory traffic) when scale == 1,
        # the usual incoming gradient of a loss, so no host sync is needed to skip it.
        s = tl.load(SCALE)
        if s != 1.0:
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < numel
            x = tl.load(X + offs, mask=mask, other=0.0)
            tl.store(X + offs, (x.to(s.dtype) * s).to(X.dtype.element_ty), mask=mask)

    return SimpleNamespace(fwd=cross_entropy_fwd_kernel, bwd=cross_entropy_bwd_kernel, scale=scale_kernel)
