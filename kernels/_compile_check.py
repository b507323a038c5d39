"""Compile every Triton kernel for a GPU architecture on a machine without a GPU.

The CPU interpreter checks numerics but not what the compiler accepts (types
in loops, layouts, dot shapes, shared memory).  This drives the real op code
paths on CPU tensors with ``_common.LAUNCH_HOOK`` set, so each launch is
compiled ahead of time (``triton.compile`` down to cubin, for an explicit
target) instead of being run.  Must run without TRITON_INTERPRET.

    python -m kernels._compile_check [--arch 90] [--quick | --all-configs]

--quick (used by the tests: ~10-20 s with a cold Triton cache) compiles one
shape per op in bf16 with the first autotune config; the default compiles
several shapes in bf16 and fp32 with the smallest and largest configs
(minutes); --all-configs compiles every autotune candidate.
"""

import argparse
import json
import sys

import torch

from . import _common
from ._common import triton

# Largest shared memory one Hopper block may use (227 KiB opt-in).
HOPPER_SMEM_BYTES = 232448


def _pick(configs, which: str):
    if which == "all" or len(configs) <= 1:
        return list(configs)
    if which == "first":
        return [configs[0]]
    return [configs[0], configs[-1]]  # "edges": smallest and largest tiles


def _compile_launch(kernel, args, kwargs, arch: int, which: str, results: list):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import mangle_type

    tuned = isinstance(kernel, (triton.runtime.Autotuner, _common.FixedConfig))
    fn = kernel.fn if tuned else kernel
    configs = _pick(kernel.configs, which) if tuned else [triton.Config({})]
    for cfg in configs:
        bound = dict(zip(fn.arg_names, args))
        bound.update(kwargs)
        bound.update(cfg.kwargs)
        signature, constexprs = {}, {}
        for param in fn.params:
            value = bound[param.name]
            if param.is_constexpr:
                signature[param.name], constexprs[param.name] = "constexpr", value
            else:
                signature[param.name] = mangle_type(value)
        src = ASTSource(fn, signature, constexprs)
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", arch, 32),
            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
        )
        results.append(
            {
                "kernel": fn.__name__,
                "dtype": str(next(v.dtype for v in args if isinstance(v, torch.Tensor))),
                "config": {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                "constexprs": {k: str(v) for k, v in constexprs.items() if k not in cfg.kwargs},
                "shared_bytes": compiled.metadata.shared,
                "fits_hopper_smem": compiled.metadata.shared <= HOPPER_SMEM_BYTES,
            }
        )


def _drive_ops(dtype: torch.dtype, quick: bool) -> None:
    """Call every custom op's real implementation once (launches are hooked)."""
    # Module objects via import_module: kernels.layer_norm etc. are shadowed
    # by the public functions of the same names on the package.
    from importlib import import_module

    attention, cross_entropy, layer_norm, mlp = (
        import_module(f"{__package__}.{name}") for name in ("attention", "cross_entropy", "layer_norm", "mlp")
    )

    def t(*shape, dt=dtype):
        return torch.zeros(*shape, dtype=dt)

    for n in (768,) if quick else (768, 1000):
        x, w = t(4, n), t(n)
        layer_norm.layer_norm_fwd(x, w, w, 1e-5)
        stats = t(4, dt=torch.float32)
        layer_norm.layer_norm_bwd(x, x, w, stats, stats)
    for d, causal in ((64, True),) if quick else ((64, False), (64, True), (128, True), (48, False)):
        q = t(1, 2, 40, d)
        lse = t(1, 2, 40, dt=torch.float32)
        attention.attention_fwd(q, q, q, causal, 0.125)
        attention.attention_bwd(q, q, q, q, q, lse, causal, 0.125)
    logits, target = t(4, 50257), torch.zeros(4, dtype=torch.long)
    lse = t(4, dt=torch.float32)
    cross_entropy.cross_entropy_fwd(logits, target, 0.1, -100, 50257)
    cross_entropy.cross_entropy_bwd(t(()), logits, target, lse, 0.1, -100, 50257)
    cross_entropy.cross_entropy_fwd_inplace(logits, target, 0.1, -100, 50257)
    cross_entropy.scale_(logits, t(()))
    cross_entropy.fused_linear_cross_entropy_fwd(t(4, 64), t(100, 64), target, t(100), 0.1, -100, 2)
    x, b = t(8, 3072), t(3072)
    mlp.bias_gelu_fwd(x, b)
    mlp.bias_gelu_bwd(x, x, b)
    mlp.swiglu_fwd(x, x)
    mlp.swiglu_bwd(x, x, x)


def compile_all(arch: int = 90, quick: bool = False, all_configs: bool = False) -> list:
    if _common.interpreting():
        raise RuntimeError("kernels._compile_check must run without TRITON_INTERPRET=1")
    if not _common.HAS_TRITON:
        raise RuntimeError("kernels._compile_check needs triton")
    which = "all" if all_configs else "first" if quick else "edges"
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float32)
    results: list = []
    _common.LAUNCH_HOOK = lambda kernel, args, kwargs: _compile_launch(
        kernel, args, kwargs, arch, which, results
    )
    try:
        for dtype in dtypes:
            _drive_ops(dtype, quick)
    finally:
        _common.LAUNCH_HOOK = None
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="one shape per op, bf16, first config")
    mode.add_argument("--all-configs", action="store_true", help="compile every autotune config")
    parser.add_argument("--json", action="store_true", help="print one JSON record per compile")
    args = parser.parse_args(argv)
    results = compile_all(args.arch, quick=args.quick, all_configs=args.all_configs)
    for r in results:
        print(
            json.dumps(r)
            if args.json
            else f"{r['kernel']:<14} {r['dtype']:<15} {r['config']} smem={r['shared_bytes']}"
            + ("" if r["fits_hopper_smem"] else "  (exceeds Hopper smem: autotune skips it)")
        )
    print(f"compiled {len(results)} kernel variants for sm_{args.arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
