"""Shared plumbing for the Triton kernels: optional triton import, interpreter
detection, launch-time config selection and argument checks.

Kernel modules never decorate at import time.  Each one has a
``_triton_kernels(interpret)`` factory (cached per flag) that defines its
``@triton.jit`` functions on first use, so TRITON_INTERPRET is read when a
kernel is first *launched*, not when ``kernels`` is imported.
"""

from __future__ import annotations

import contextlib
import os

import torch

try:  # triton is optional: without it every op falls back to torch.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on triton-less machines
    triton = None
    tl = None

HAS_TRITON = triton is not None

# torch.library namespace for the custom ops (torch.ops.fused_kernels.*).
NAMESPACE = "fused_kernels"


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1).

    Parsed like triton's own knob; read from os.environ (not triton.knobs) so
    torch.compile can trace the dispatch code without a graph break."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes", "y")


def check_triton(op: str, *tensors: torch.Tensor) -> None:
    """Raise a clear error when the Triton path of ``op`` cannot run here."""
    if not HAS_TRITON:
        raise RuntimeError(
            f"kernels: the triton implementation of {op} needs the 'triton' package, "
            "which is not installed (use impl='torch' or impl='auto')"
        )
    if interpreting():
        return
    if not all(t.is_cuda for t in tensors):
        raise RuntimeError(
            f"kernels: the triton implementation of {op} needs a CUDA tensor (or TRITON_INTERPRET=1 on CPU)"
        )


def autotuning() -> bool:
    """False when KERNELS_AUTOTUNE=0: each kernel then runs its first (default)
    config, compiled once, which keeps correctness tests on a GPU fast."""
    return os.environ.get("KERNELS_AUTOTUNE", "1").strip().lower() not in ("0", "false", "off", "no")


class FixedConfig:
    """A kernel launched with one config (KERNELS_AUTOTUNE=0): the first of its
    candidates that the autotuner's pruning function keeps for these arguments."""

    def __init__(self, kernel, configs, prune=None):
        self.fn, self.configs, self.prune = kernel, configs, prune

    def config_for(self, args, kwargs):
        configs = self.configs
        if self.prune is not None:
            configs = self.prune(configs, dict(zip(self.fn.arg_names, args)), **kwargs) or configs
        return configs[0]


def maybe_autotune(kernel, configs, key, interpret: bool, **kwargs):
    """Wrap ``kernel`` in ``triton.autotune`` on GPU; leave it bare under the
    interpreter, where benchmarking every config would only cost time and the
    caller passes one small config (see ``launch``).  ``configs[0]`` is the
    default: the config used when autotuning is off."""
    if interpret:
        return kernel
    if not autotuning():
        return FixedConfig(kernel, configs, (kwargs.get("prune_configs_by") or {}).get("early_config_prune"))
    return triton.autotune(configs=configs, key=key, **kwargs)(kernel)


# When set, launch() hands (kernel, args, kwargs) to this hook instead of
# running the kernel; kernels/_compile_check.py uses it to compile every
# launch for a GPU target on a machine without a GPU.
LAUNCH_HOOK = None


def launch(kernel, grid, *args, interp_meta: dict, **kwargs):
    """Launch ``kernel``.  An autotuned kernel picks its block sizes itself; a
    fixed one gets its config; a bare one (interpreter) gets the single small
    config ``interp_meta``."""
    if LAUNCH_HOOK is not None:
        return LAUNCH_HOOK(kernel, args, kwargs)
    if isinstance(kernel, triton.runtime.Autotuner):
        return kernel[grid](*args, **kwargs)
    if isinstance(kernel, FixedConfig):
        cfg = kernel.config_for(args, kwargs)
        return kernel.fn[grid](
            *args, **kwargs, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages
        )
    with _interpretable_stdlib():
        return kernel[grid](*args, **kwargs, **interp_meta)


_INTERPRETED = {}


@contextlib.contextmanager
def _interpretable_stdlib():
    """Let the interpreter call triton.language's own @jit helpers.

    tl.sum, tl.max, tl.sigmoid, ... are decorated when triton.language is
    imported; if TRITON_INTERPRET was not set then, they are JITFunctions,
    whose __call__ refuses to run from Python.  For the duration of an
    interpreted launch, route such calls through an InterpretedFunction.
    The GPU compiler never calls JITFunction.__call__, so it is unaffected."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def call(self, *args, **kwargs):
        # Keyed by id: JITFunction.__hash__ walks the source, which fails
        # while the interpreter has tl.* patched.
        if id(self) not in _INTERPRETED:
            _INTERPRETED[id(self)] = (self, InterpretedFunction(self.fn))
        return _INTERPRETED[id(self)][1](*args, **kwargs)

    original = JITFunction.__call__
    JITFunction.__call__ = call
    try:
        yield
    finally:
        JITFunction.__call__ = original


def acc_dtype(dtype: torch.dtype):
    """Accumulator type: fp32 for 16/32-bit inputs, fp64 for fp64 (gradcheck)."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision for fp32 operands follows torch's TF32 switch."""
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"


def num_programs(device: torch.device, rows: int, interpret_programs: int = 3) -> int:
    """Programs for persistent row loops (partial-sum reductions): one per SM on
    GPU; a few under the interpreter so multi-row programs are still tested."""
    if device.type == "cuda":
        n = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        n = interpret_programs
    return max(1, min(n, rows))


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
