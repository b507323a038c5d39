"""Helpers for checking a kernel against its torch reference (used by tests)."""

import torch


def outputs_and_grads(fn, inputs, grad_out=None):
    """Run ``fn(*inputs)`` and backprop ``grad_out`` (random if None) into every
    input that requires grad.  Returns (output, grads, grad_out)."""
    out = fn(*inputs)
    if grad_out is None:
        grad_out = torch.randn_like(out)
    wrt = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    grads = torch.autograd.grad(out, wrt, grad_out, allow_unused=False) if wrt else ()
    return out, grads, grad_out


def assert_matches(fn, ref_fn, inputs, rtol: float, atol: float, grad_fn_name: str | None = None):
    """Forward and every input gradient of ``fn`` must match ``ref_fn``.

    ``grad_fn_name`` guards against a silent fallback: the output must come
    from that autograd.Function (i.e. the Triton path really ran)."""
    out, grads, grad_out = outputs_and_grads(fn, inputs)
    if grad_fn_name is not None:
        assert type(out.grad_fn).__name__ == grad_fn_name, type(out.grad_fn).__name__
    ref, ref_grads, _ = outputs_and_grads(ref_fn, inputs, grad_out)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    assert len(grads) == len(ref_grads)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(
            g, r, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, i=i: f"gradient of input {i}: {m}"
        )
    return out, grads
