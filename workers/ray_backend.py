"""What a Ray Train worker does to join and leave the job's process group, with public torch and
Ray Train APIs only, and the workers' training function.

The control side (`orchestrator/ray/process_group.py`, a Ray Train backend) runs in a process
that never imports torch: it asks rank 0 for an address and a free port, then calls these on
every worker, as Ray Train's `TorchConfig` would: the `torch.distributed` environment torchrun
sets, `init_process_group` over `env://` (gloo on CPUs, NCCL on GPUs), and at the end
`destroy_process_group`. Each function imports torch where it runs, on the workers.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import ray


def train_worker(config: dict) -> None:
    from workers.ray_context import train_worker as run

    run(config)


def address_and_port() -> tuple[str, int]:
    """This node's address and a free port on it: rank 0's, for the others to reach."""
    addr = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return addr, s.getsockname()[1]


def set_distributed_env(addr: str, port: int) -> None:
    """MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, ... as torchrun sets them."""
    context = ray.train.get_context()
    os.environ.update(
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        LOCAL_RANK=str(context.get_local_rank()),
        LOCAL_WORLD_SIZE=str(context.get_local_world_size()),
        NODE_RANK=str(context.get_node_rank()),
        RANK=str(context.get_world_rank()),
        WORLD_SIZE=str(context.get_world_size()),
    )


def join_process_group(backend: str, rank: int, world: int, timeout_s: int) -> None:
    import torch.distributed as dist

    if backend == "nccl" and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
        # a collective that times out fails the rank instead of hanging it (as TorchConfig sets)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def leave_process_group(destroy: bool) -> None:
    import torch
    import torch.distributed as dist

    if destroy and dist.is_initialized():
        dist.destroy_process_group()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class CudaDeviceOfRank:
    """The worker's CUDA device made current for its training function (as `TorchConfig`'s)."""

    def __enter__(self):
        import torch

        if torch.cuda.is_available():
            from ray.train.torch import get_device

            device = get_device()
            if device.type == "cuda":
                torch.cuda.set_device(device)

    def __exit__(self, *exc):
        return False
