"""Fused Triton training kernels with exact PyTorch fallbacks.

Every op takes ``impl``:
  "torch"  - the built-in op (F.layer_norm, F.scaled_dot_product_attention,
             F.cross_entropy, F.gelu): the reference path.
  "triton" - the fused Triton kernels (forward and backward).  Needs CUDA
             tensors, or TRITON_INTERPRET=1 to run them on CPU (slowly).
  "auto"   - the built-in op on CPU; on CUDA the Triton kernel only where the
             committed benchmark table (kernels/dispatch_table.json, written by
             bench/kernels.py --write-table) records that it won on this GPU,
             for this dtype and shape bucket (kernels/dispatch.py).

Depends on torch and (optionally) triton only; imports cleanly without triton.
"""

from torch import Tensor

from core.spec.schema import KERNEL_IMPLS, KERNEL_OPS

from . import dispatch
from ._common import HAS_TRITON, check_triton
from .attention import attention_torch, attention_triton
from .cross_entropy import (
    cross_entropy_torch,
    cross_entropy_triton,
    fused_linear_cross_entropy_torch,
    fused_linear_cross_entropy_triton,
)
from .layer_norm import layer_norm_torch, layer_norm_triton
from .mlp import bias_gelu_torch, bias_gelu_triton, swiglu_torch, swiglu_triton

OPS = KERNEL_OPS  # the names a spec's kernels section and a model config use (core.spec)
EXTRA_OPS = ("fused_linear_cross_entropy", "swiglu")
IMPLS = KERNEL_IMPLS


def available_impls() -> dict:
    """{op: impls usable in this process}, for configs/specs to validate against."""
    impls = IMPLS if HAS_TRITON else ("auto", "torch")
    return {op: impls for op in OPS + EXTRA_OPS}


def resolve(op: str, impl: str, *tensors: Tensor, **dims) -> str:
    """The implementation ("triton" or "torch") that ``impl`` means for these tensors;
    ``dims`` are the op's deciding dimensions for "auto" (see kernels/dispatch.py)."""
    if impl not in IMPLS:
        raise ValueError(f"kernels.{op}: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        if not (HAS_TRITON and all(t.is_cuda for t in tensors)):
            return "torch"
        return dispatch.choose(op, tensors[0].dtype, tensors[0].device.index or 0, **dims)
    if impl == "triton":
        check_triton(op, *tensors)
    return impl


def layer_norm(x: Tensor, weight, bias, eps: float = 1e-5, impl: str = "auto") -> Tensor:
    """LayerNorm over the last dim of ``x`` (any leading shape)."""
    if resolve("layer_norm", impl, x, dim=x.shape[-1]) == "triton":
        return layer_norm_triton(x, weight, bias, eps)
    return layer_norm_torch(x, weight, bias, eps)


def attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale=None, impl: str = "auto"
) -> Tensor:
    """Softmax attention on (batch, heads, seq, head_dim); no dropout.
    ``scale`` defaults to 1/sqrt(head_dim); causal is top-left aligned like SDPA."""
    if resolve("attention", impl, q, k, v, head_dim=q.shape[-1], seq=q.shape[-2], causal=causal) == "triton":
        return attention_triton(q, k, v, causal, scale)
    return attention_torch(q, k, v, causal, scale)


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    impl: str = "auto",
    inplace_backward: bool = False,
    classes: int | None = None,
) -> Tensor:
    """Mean cross-entropy over non-ignored rows; logits (N, V) or (B, T, V).
    The loss is fp32 for 16-bit logits, as under autocast.  With
    ``inplace_backward`` the Triton path overwrites ``logits`` with their
    gradient during the forward (no (N, V) allocation at all): for callers that
    do not read the logits after the loss, like the training loop.  ``classes``:
    only the first that many columns are classes (the rest are padding, e.g. a
    vocabulary rounded up to a multiple of 64, and get a zero gradient)."""
    vocab = logits.shape[-1] if classes is None else classes
    if resolve("cross_entropy", impl, logits, vocab=vocab) == "triton":
        return cross_entropy_triton(logits, target, label_smoothing, ignore_index, inplace_backward, classes)
    return cross_entropy_torch(logits, target, label_smoothing, ignore_index, classes)


def fused_linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias=None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
    impl: str = "auto",
    chunk_size=None,
) -> Tensor:
    """cross_entropy(hidden @ weight.T + bias, target) without materialising the
    full logits on the Triton path (rows are processed ``chunk_size`` at a time)."""
    if (
        resolve(
            "fused_linear_cross_entropy", impl, hidden, weight, vocab=weight.shape[0], hidden=weight.shape[1]
        )
        == "triton"
    ):
        return fused_linear_cross_entropy_triton(
            hidden, weight, target, bias, label_smoothing, ignore_index, chunk_size
        )
    return fused_linear_cross_entropy_torch(hidden, weight, target, bias, label_smoothing, ignore_index)


def bias_gelu(x: Tensor, bias: Tensor, impl: str = "auto") -> Tensor:
    """F.gelu(x + bias) with the exact erf GELU (nn.GELU() default)."""
    if resolve("bias_gelu", impl, x, bias, dim=x.shape[-1]) == "triton":
        return bias_gelu_triton(x, bias)
    return bias_gelu_torch(x, bias)


def swiglu(a: Tensor, b: Tensor, impl: str = "auto") -> Tensor:
    """F.silu(a) * b."""
    if resolve("swiglu", impl, a, b) == "triton":
        return swiglu_triton(a, b)
    return swiglu_torch(a, b)


__all__ = [
    "OPS",
    "EXTRA_OPS",
    "IMPLS",
    "HAS_TRITON",
    "available_impls",
    "resolve",
    "layer_norm",
    "attention",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "bias_gelu",
    "swiglu",
]
