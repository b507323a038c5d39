"""Fused log-softmax + NLL with label smoothing and ignore_index, mean over
the non-ignored rows (the semantics of F.cross_entropy(reduction="mean")).

One program per row streams the vocabulary in BLOCK_V chunks with an online
max / sum-exp, so no (N, V) probability tensor is ever written.  For a row
with target t and smoothing e over V classes:

    loss = lse - (1 - e) * x[t] - e * mean(x)
    dx   = softmax(x) - e / V - (1 - e) * onehot(t)      (0 for ignored rows)

``cross_entropy`` saves only the per-row lse (N floats) and recomputes the
softmax in the backward from the caller's logits, which it never modifies;
with ``inplace_backward=True`` (for callers whose logits are dead after the
loss, like the training loop) it writes the gradient into the logits during
the forward instead, so neither pass allocates an (N, V) tensor.  The loss is
fp32 for 16-bit logits (fp64 for fp64), as autocast gives for F.cross_entropy.
``fused_linear_cross_entropy`` owns its logits, so it computes each row chunk's
logits, overwrites them in place with the gradient in the forward pass
(Liger-Kernel's scheme) and immediately folds them into d_hidden / d_weight;
the full (N, V) logits never exist.  See NOTES.md for the trade-off.

The kernels' Triton source is in cross_entropy_jit.py; this file holds the rest, top to
bottom: references, configs, jit factory, custom ops with their fakes, autograd functions.
"""

import functools
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._common import NAMESPACE, acc_dtype, interpreting, launch, maybe_autotune, next_power_of_2, triton
from .cross_entropy_jit import jit_kernels

INTERPRET_META = {"BLOCK_V": 16}  # small chunks: several per row even for tiny V


def cross_entropy_torch(
    logits: Tensor,
    target: Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    classes: int | None = None,
) -> Tensor:
    """Reference path: the built-in op on (N, V) rows.  16-bit logits are upcast
    first, as autocast does for F.cross_entropy, so the loss is fp32."""
    if classes is not None and classes != logits.shape[-1]:
        logits = logits[..., :classes]
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )


def fused_linear_cross_entropy_torch(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias=None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> Tensor:
    """Reference path: materialises the full logits."""
    return cross_entropy_torch(F.linear(hidden, weight, bias), target, label_smoothing, ignore_index)


def _configs():
    # Memory-bound row streaming: bigger chunks amortise the per-chunk
    # reductions; 8-16 warps keep enough loads in flight on Hopper.  The first
    # config that the pruning keeps is the default when autotuning is off.
    # (BLOCK_V, warps): the configs an H100 chose for vocabularies of 1000 and 50257.
    return [
        triton.Config({"BLOCK_V": bv}, num_warps=w) for bv, w in ((8192, 16), (2048, 4), (4096, 8), (1024, 8))
    ]


def _prune(configs, nargs, **kwargs):
    """No chunk wider than the vocabulary needs (but keep the 1024-wide ones)."""
    widest = max(1024, next_power_of_2(nargs["V"]))
    return [c for c in configs if c.kwargs["BLOCK_V"] <= widest]


@functools.cache
def _triton_kernels(interpret: bool):
    jit = jit_kernels()  # decorated here, at the first launch (cross_entropy_jit.py)
    prune = {"early_config_prune": _prune}
    return SimpleNamespace(
        # The in-place variant rewrites LOGITS, so benchmarking configs must restore it.
        fwd=maybe_autotune(
            jit.fwd,
            _configs(),
            ["V", "WRITE_GRAD"],
            interpret,
            restore_value=["LOGITS"],
            prune_configs_by=prune,
        ),
        bwd=maybe_autotune(jit.bwd, _configs(), ["V"], interpret, prune_configs_by=prune),
        scale=jit.scale,
    )


def _acc_torch(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _ce_rows(
    logits: Tensor,
    target: Tensor,
    loss_rows: Tensor,
    lse: Tensor,
    grad_scale: Tensor,
    smoothing: float,
    ignore_index: int,
    write_grad: bool,
    classes: int | None = None,
) -> None:
    """Launch the row kernel on a (rows, V) block; optionally grad in place.  Only the
    first ``classes`` columns are read (and written)."""
    rows, vocab = logits.shape
    vocab = vocab if classes is None else classes
    if rows == 0:
        return
    launch(
        _triton_kernels(interpreting()).fwd,
        (rows,),
        logits,
        target,
        loss_rows,
        lse,
        grad_scale,
        logits.stride(0),
        vocab,
        ignore_index,
        smoothing,
        WRITE_GRAD=write_grad,
        ACC=acc_dtype(logits.dtype),
        interp_meta=INTERPRET_META,
    )


# --- custom ops: opaque to torch.compile, shapes given by the fake kernels ---


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_fwd", mutates_args=())
def cross_entropy_fwd(
    logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int, classes: int
) -> tuple[Tensor, Tensor]:
    acc = _acc_torch(logits.dtype)
    loss_rows = logits.new_empty(logits.shape[:1], dtype=acc)
    lse = torch.empty_like(loss_rows)
    _ce_rows(
        logits, target, loss_rows, lse, lse, label_smoothing, ignore_index, write_grad=False, classes=classes
    )
    n_valid = (target != ignore_index).sum()
    # 0/0 -> nan when every target is ignored, exactly like F.cross_entropy.
    return loss_rows.sum() / n_valid, lse


@cross_entropy_fwd.register_fake
def _(logits, target, label_smoothing, ignore_index, classes):
    acc = _acc_torch(logits.dtype)
    return logits.new_empty((), dtype=acc), logits.new_empty(logits.shape[:1], dtype=acc)


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_fwd_inplace", mutates_args=("logits",))
def cross_entropy_fwd_inplace(
    logits: Tensor, target: Tensor, label_smoothing: float, ignore_index: int, classes: int
) -> Tensor:
    """The loss, with ``logits`` overwritten by d(loss)/d(logits) (Liger-Kernel's scheme);
    columns past ``classes`` (padding) get a zero gradient."""
    acc = _acc_torch(logits.dtype)
    loss_rows = logits.new_empty(logits.shape[:1], dtype=acc)
    lse = torch.empty_like(loss_rows)
    n_valid = (target != ignore_index).sum()
    grad_scale = torch.where(n_valid > 0, 1.0 / n_valid.to(acc), 0.0).to(acc).reshape(1)
    _ce_rows(
        logits,
        target,
        loss_rows,
        lse,
        grad_scale,
        label_smoothing,
        ignore_index,
        write_grad=True,
        classes=classes,
    )
    if classes < logits.shape[1]:
        logits[:, classes:].zero_()
    return loss_rows.sum() / n_valid


@cross_entropy_fwd_inplace.register_fake
def _(logits, target, label_smoothing, ignore_index, classes):
    return logits.new_empty((), dtype=_acc_torch(logits.dtype))


@torch.library.custom_op(f"{NAMESPACE}::scale_", mutates_args=("x",))
def scale_(x: Tensor, scale: Tensor) -> None:
    """x *= scale (a one-element tensor), skipped on the device when scale == 1."""
    if x.numel():
        launch(
            _triton_kernels(interpreting()).scale,
            lambda meta: (triton.cdiv(x.numel(), 4096),),
            x,
            scale.reshape(1).to(_acc_torch(x.dtype)),
            x.numel(),
            BLOCK=4096,
            interp_meta={},
        )


@scale_.register_fake
def _(x, scale):
    return None


@torch.library.custom_op(f"{NAMESPACE}::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(
    grad: Tensor,
    logits: Tensor,
    target: Tensor,
    lse: Tensor,
    label_smoothing: float,
    ignore_index: int,
    classes: int,
) -> Tensor:
    rows, vocab = logits.shape[0], classes
    dlogits = torch.empty_like(logits)
    if classes < logits.shape[1]:  # padding columns: no class, no gradient
        dlogits[:, classes:].zero_()
    if rows == 0:
        return dlogits
    # d(mean)/d(row) as a device scalar: no host sync.  Ignored rows get 0 in
    # the kernel, so n_valid == 0 (scale inf) never reaches memory.
    grad_scale = (grad.to(lse.dtype) / (target != ignore_index).sum()).reshape(1)
    launch(
        _triton_kernels(interpreting()).bwd,
        (rows,),
        logits,
        target,
        lse,
        dlogits,
        grad_scale,
        logits.stride(0),
        dlogits.stride(0),
        vocab,
        ignore_index,
        label_smoothing,
        ACC=acc_dtype(logits.dtype),
        interp_meta=INTERPRET_META,
    )
    return dlogits


@cross_entropy_bwd.register_fake
def _(grad, logits, target, lse, label_smoothing, ignore_index, classes):
    return torch.empty_like(logits)


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, label_smoothing, ignore_index, classes):
        loss, lse = cross_entropy_fwd(logits, target, label_smoothing, ignore_index, classes)
        ctx.save_for_backward(logits, target, lse)
        ctx.smoothing, ctx.ignore_index, ctx.classes = label_smoothing, ignore_index, classes
        return loss

    @staticmethod
    def backward(ctx, grad):
        logits, target, lse = ctx.saved_tensors
        dlogits = cross_entropy_bwd(grad, logits, target, lse, ctx.smoothing, ctx.ignore_index, ctx.classes)
        return dlogits, None, None, None, None


def _rows(logits: Tensor, target: Tensor, name: str):
    vocab = logits.shape[-1]
    logits = logits.reshape(-1, vocab)
    target = target.reshape(-1)
    if target.shape[0] != logits.shape[0]:
        raise ValueError(f"kernels.{name}: {logits.shape[0]} rows but {target.shape[0]} targets")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    return logits, target.contiguous()


class CrossEntropyInplaceFunction(torch.autograd.Function):
    """The forward writes the gradient into the logits; the backward only scales it.
    No (N, V) tensor is allocated at all, in forward or backward."""

    @staticmethod
    def forward(ctx, logits, target, label_smoothing, ignore_index, classes):
        loss = cross_entropy_fwd_inplace(logits, target, label_smoothing, ignore_index, classes)
        ctx.save_for_backward(logits)  # now the gradient of the mean loss
        return loss

    @staticmethod
    def backward(ctx, grad):
        (dlogits,) = ctx.saved_tensors
        scale_(dlogits, grad)
        return dlogits, None, None, None, None


def cross_entropy_triton(
    logits: Tensor,
    target: Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    inplace_backward: bool = False,
    classes: int | None = None,
) -> Tensor:
    logits, target = _rows(logits, target, "cross_entropy")
    classes = logits.shape[1] if classes is None else int(classes)
    if not 0 < classes <= logits.shape[1]:
        raise ValueError(f"kernels.cross_entropy: classes must be in [1, {logits.shape[1]}], got {classes}")
    args = (logits, target, float(label_smoothing), int(ignore_index), classes)
    if inplace_backward and logits.requires_grad and torch.is_grad_enabled():
        return CrossEntropyInplaceFunction.apply(*args)
    return CrossEntropyFunction.apply(*args)


# --- fused final linear + cross-entropy ------------------------------------


def default_chunk_size(rows: int, vocab: int, hidden: int) -> int:
    # Liger-Kernel's heuristic: a chunk's logits (chunk x V) are about as large
    # as the whole hidden input (rows x H).
    return next_power_of_2(max(1, triton.cdiv(rows, triton.cdiv(vocab, hidden))))


@torch.library.custom_op(f"{NAMESPACE}::fused_linear_cross_entropy_fwd", mutates_args=())
def fused_linear_cross_entropy_fwd(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None,
    label_smoothing: float,
    ignore_index: int,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    rows, vocab = hidden.shape[0], weight.shape[0]
    acc = _acc_torch(hidden.dtype)
    n_valid = (target != ignore_index).sum()
    # Gradients of the mean loss; 0 (not inf) when every row is ignored, so
    # all-ignored inputs give zero gradients like F.cross_entropy.
    grad_scale = torch.where(n_valid > 0, 1.0 / n_valid.to(acc), 0.0).to(acc).reshape(1)
    loss_rows = hidden.new_empty((rows,), dtype=acc)
    lse = torch.empty_like(loss_rows)
    d_hidden = torch.empty_like(hidden)
    d_weight = weight.new_zeros(weight.shape, dtype=acc)
    d_bias = weight.new_zeros((vocab,) if bias is not None else (0,), dtype=acc)
    for start in range(0, rows, chunk_size):
        end = min(start + chunk_size, rows)
        h = hidden[start:end]
        logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())
        _ce_rows(
            logits,
            target[start:end],
            loss_rows[start:end],
            lse[start:end],
            grad_scale,
            label_smoothing,
            ignore_index,
            write_grad=True,
        )
        grad = logits  # overwritten in place by the kernel
        torch.mm(grad, weight, out=d_hidden[start:end])
        if acc == grad.dtype:
            d_weight.addmm_(grad.t(), h)
        else:  # bf16/fp16 chunk products, accumulated across chunks in fp32
            d_weight += (grad.t() @ h).to(acc)
        if bias is not None:
            d_bias += grad.sum(0, dtype=acc)
    loss = loss_rows.sum() / n_valid
    return loss, d_hidden, d_weight.to(weight.dtype), d_bias.to(weight.dtype)


@fused_linear_cross_entropy_fwd.register_fake
def _(hidden, weight, target, bias, label_smoothing, ignore_index, chunk_size):
    d_bias = weight.new_empty((weight.shape[0],) if bias is not None else (0,))
    loss = hidden.new_empty((), dtype=_acc_torch(hidden.dtype))
    return loss, torch.empty_like(hidden), torch.empty_like(weight), d_bias


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, label_smoothing, ignore_index, chunk_size):
        loss, d_hidden, d_weight, d_bias = fused_linear_cross_entropy_fwd(
            hidden, weight, target, bias, label_smoothing, ignore_index, chunk_size
        )
        ctx.has_bias = bias is not None
        ctx.save_for_backward(d_hidden, d_weight, d_bias)
        return loss

    @staticmethod
    def backward(ctx, grad):
        # Gradients were computed in the forward; only the chain rule is left.
        d_hidden, d_weight, d_bias = ctx.saved_tensors
        d_bias = d_bias * grad if ctx.has_bias else None
        return d_hidden * grad, d_weight * grad, None, d_bias, None, None, None


def fused_linear_cross_entropy_triton(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias=None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    chunk_size=None,
) -> Tensor:
    shape = hidden.shape
    hidden = hidden.reshape(-1, shape[-1]).contiguous()
    target = target.reshape(-1).contiguous()
    if weight.dim() != 2 or weight.shape[1] != shape[-1]:
        raise ValueError("kernels.fused_linear_cross_entropy: weight must be (V, hidden)")
    if target.shape[0] != hidden.shape[0]:
        raise ValueError("kernels.fused_linear_cross_entropy: one target per row expected")
    if chunk_size is None:
        chunk_size = default_chunk_size(hidden.shape[0], weight.shape[0], weight.shape[1])
    loss = FusedLinearCrossEntropyFunction.apply(
        hidden, weight.contiguous(), target, bias, float(label_smoothing), int(ignore_index), int(chunk_size)
    )
    return loss
