"""Fused Triton training kernels with exact PyTorch fallbacks.

Every op takes ``impl``:
  "torch"  - the built-in op (F.layer_norm, F.scaled_dot_product_attention,
             F.cross_entropy, F.gelu): the reference path.
  "triton" - the fused Triton kernels (forward and backward).  Needs CUDA
             tensors, or TRITON_INTERPRET=1 to run them on CPU (slowly).
  "auto"   - the built-in op on CPU; on CUDA the Triton kernel only where it
             was measured to win (``_CUDA_TRITON_WINS``; empty until GPU
             benchmark results are committed, see kernels/NOTES.md).

Depends on torch and (optionally) triton only; imports cleanly without triton.
"""
from torch import Tensor

from ._common import HAS_TRITON, check_triton
from .attention import attention_torch, attention_triton
from .cross_entropy import (cross_entropy_torch, cross_entropy_triton,
                            fused_linear_cross_entropy_torch, fused_linear_cross_entropy_triton)
from .layer_norm import layer_norm_torch, layer_norm_triton
from .mlp import bias_gelu_torch, bias_gelu_triton, swiglu_torch, swiglu_triton

OPS = ("layer_norm", "attention", "cross_entropy", "bias_gelu")
EXTRA_OPS = ("fused_linear_cross_entropy", "swiglu")
IMPLS = ("auto", "triton", "torch")

# op -> predicate(*tensors) saying Triton beat the built-in op at these shapes
# on this GPU, filled in from bench/kernels.py results.  No GPU was available
# when these kernels were written, so nothing is measured yet and "auto" keeps
# the built-in path on CUDA for every op.  (Liger-Kernel reports its fused
# LayerNorm 3.3x *slower* than torch fwd+bwd at N=1024 on H100, so a win must
# be measured per op and shape, never assumed.)
_CUDA_TRITON_WINS: dict = {}


def available_impls() -> dict:
    """{op: impls usable in this process}, for configs/specs to validate against."""
    impls = IMPLS if HAS_TRITON else ("auto", "torch")
    return {op: impls for op in OPS + EXTRA_OPS}


def _resolve(op: str, impl: str, *tensors: Tensor) -> str:
    if impl not in IMPLS:
        raise ValueError(f"kernels.{op}: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        wins = _CUDA_TRITON_WINS.get(op)
        use_triton = (HAS_TRITON and wins is not None and all(t.is_cuda for t in tensors)
                      and wins(*tensors))
        return "triton" if use_triton else "torch"
    if impl == "triton":
        check_triton(op, *tensors)
    return impl


def layer_norm(x: Tensor, weight, bias, eps: float = 1e-5, impl: str = "auto") -> Tensor:
    """LayerNorm over the last dim of ``x`` (any leading shape)."""
    if _resolve("layer_norm", impl, x) == "triton":
        return layer_norm_triton(x, weight, bias, eps)
    return layer_norm_torch(x, weight, bias, eps)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale=None,
              impl: str = "auto") -> Tensor:
    """Softmax attention on (batch, heads, seq, head_dim); no dropout.
    ``scale`` defaults to 1/sqrt(head_dim); causal is top-left aligned like SDPA."""
    if _resolve("attention", impl, q, k, v) == "triton":
        return attention_triton(q, k, v, causal, scale)
    return attention_torch(q, k, v, causal, scale)


def cross_entropy(logits: Tensor, target: Tensor, label_smoothing: float = 0.0,
                  ignore_index: int = -100, impl: str = "auto") -> Tensor:
    """Mean cross-entropy over non-ignored rows; logits (N, V) or (B, T, V)."""
    if _resolve("cross_entropy", impl, logits) == "triton":
        return cross_entropy_triton(logits, target, label_smoothing, ignore_index)
    return cross_entropy_torch(logits, target, label_smoothing, ignore_index)


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, bias=None,
                               label_smoothing: float = 0.0, ignore_index: int = -100,
                               impl: str = "auto", chunk_size=None) -> Tensor:
    """cross_entropy(hidden @ weight.T + bias, target) without materialising the
    full logits on the Triton path (rows are processed ``chunk_size`` at a time)."""
    if _resolve("fused_linear_cross_entropy", impl, hidden, weight) == "triton":
        return fused_linear_cross_entropy_triton(hidden, weight, target, bias, label_smoothing,
                                                 ignore_index, chunk_size)
    return fused_linear_cross_entropy_torch(hidden, weight, target, bias, label_smoothing,
                                            ignore_index)


def bias_gelu(x: Tensor, bias: Tensor, impl: str = "auto") -> Tensor:
    """F.gelu(x + bias) with the exact erf GELU (nn.GELU() default)."""
    if _resolve("bias_gelu", impl, x, bias) == "triton":
        return bias_gelu_triton(x, bias)
    return bias_gelu_torch(x, bias)


def swiglu(a: Tensor, b: Tensor, impl: str = "auto") -> Tensor:
    """F.silu(a) * b."""
    if _resolve("swiglu", impl, a, b) == "triton":
        return swiglu_triton(a, b)
    return swiglu_torch(a, b)


__all__ = ["OPS", "EXTRA_OPS", "IMPLS", "HAS_TRITON", "available_impls", "layer_norm",
           "attention", "cross_entropy", "fused_linear_cross_entropy", "bias_gelu", "swiglu"]
