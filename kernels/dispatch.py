"""What `impl="auto"` runs on a GPU: the Triton kernel only where it was measured to win.

The table (``dispatch_table.json`` beside this file, or the file named by
KERNELS_DISPATCH_TABLE) is written by ``bench/kernels.py --write-table`` from
committed benchmark results.  Each entry names a GPU (its exact CUDA device
name), an op, a dtype and a shape bucket, and says which implementation won
there.  Anything the table does not name -- another GPU, another dtype, a
shape bucket nobody measured -- runs the built-in op.

Shape buckets round the deciding dimensions up to a power of two, so one
measurement stands for the shapes that tile the same way:

    layer_norm, bias_gelu        n<N>                     (last dimension)
    attention                    d<D>-s<S>-causal|full    (head dim, query length)
    cross_entropy                v<V>                     (vocabulary)
    fused_linear_cross_entropy   v<V>-h<H>                (vocabulary, hidden size)
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

TABLE_PATH = Path(__file__).with_name("dispatch_table.json")
TABLE_ENV = "KERNELS_DISPATCH_TABLE"
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def shape_bucket(op: str, **dims) -> str | None:
    """The bucket of an op's deciding dimensions (see the module docstring)."""
    if op in ("layer_norm", "bias_gelu"):
        return f"n{_pow2(dims['dim'])}"
    if op == "attention":
        return f"d{_pow2(dims['head_dim'])}-s{_pow2(dims['seq'])}-{'causal' if dims['causal'] else 'full'}"
    if op == "cross_entropy":
        return f"v{_pow2(dims['vocab'])}"
    if op == "fused_linear_cross_entropy":
        return f"v{_pow2(dims['vocab'])}-h{_pow2(dims['hidden'])}"
    return None


@functools.cache
def load_table(path: str) -> dict:
    """{(gpu, op, dtype, bucket): entry} from a table file; empty if there is none."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    return {(e["gpu"], e["op"], e["dtype"], e["bucket"]): e for e in data["entries"]}


def table() -> dict:
    return load_table(os.environ.get(TABLE_ENV) or str(TABLE_PATH))


def gpu_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


# Evaluated eagerly even while torch.compile traces a model (no graph break):
# the answer is a constant for given arguments.
@torch.compiler.assume_constant_result
def measured_impl(op: str, dtype: str, bucket: str, device_index: int) -> str:
    """ "triton" where the table records a Triton win for this GPU, op, dtype and bucket."""
    entry = table().get((gpu_name(device_index), op, dtype, bucket))
    return "triton" if entry is not None and entry["impl"] == "triton" else "torch"


def choose(op: str, dtype: torch.dtype, device_index: int, **dims) -> str:
    bucket = shape_bucket(op, **dims)
    name = DTYPE_NAMES.get(dtype)
    if bucket is None or name is None:
        return "torch"
    return measured_impl(op, name, bucket, device_index)
