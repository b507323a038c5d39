"""How Ray Train starts a job's workers, without torch in the processes that only control them.

Ray Train's `TorchConfig` lives in a module that imports torch, and Ray Train unpickles it in
the run's controller, as `TorchTrainer` imports it in the process that calls `fit()`: two
control processes that then load torch (~2-3 s of CPU each on the critical path of a start,
~200 MiB each) to set up a process group they never join. `ProcessGroupConfig` is the same
setup with torch imported only where it runs, on the workers: the controller picks the rank-0
address and hands every worker its `torch.distributed` environment, and each worker calls Ray
Train's own process-group set-up (`ray.train.torch.config`), as `TorchConfig` would.

`train_worker` is the workers' function (`workers.ray_context.train_worker`), imported where it
runs, so that the process that hands it over need not import torch either.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.train import BackendConfig
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.util import TrainingFramework

log = logging.getLogger("workers")
SHUTDOWN_TIMEOUT_S = DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S


def train_worker(config: dict) -> None:
    from workers.ray_context import train_worker as run

    run(config)


@dataclass
class ProcessGroupConfig(BackendConfig):
    """`TorchConfig`'s `env://` set-up: gloo on CPUs, NCCL on GPUs."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return ProcessGroupBackend

    @property
    def train_func_context(self):
        return CudaDeviceOfRank

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class ProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_distributed_env, addr=addr, port=port)
        world = len(worker_group)
        setups = [
            worker_group.execute_single_async(
                rank, _join_process_group, backend_config.backend, rank, world, backend_config.timeout_s
            )
            for rank in range(world)
        ]
        ray.get(setups)

    def on_shutdown(self, worker_group, backend_config) -> None:
        ends = worker_group.execute_async(_leave_process_group, len(worker_group) > 1)
        try:  # as TorchConfig's: a rank stuck in a collective must not hold the run's end
            ray.get(ends, timeout=SHUTDOWN_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            log.warning("the workers' process group did not shut down within %s s", SHUTDOWN_TIMEOUT_S)


class CudaDeviceOfRank:
    """The worker's CUDA device made current for its training function (`TorchConfig`'s)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._context = TorchConfigContextManager()
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


# --- on the workers ---


def _set_distributed_env(addr: str, port: int) -> None:
    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    _set_torch_distributed_env_vars()  # RANK, LOCAL_RANK, WORLD_SIZE, ... as torchrun sets them


def _join_process_group(backend: str, rank: int, world: int, timeout_s: int) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(backend, rank, world, "env://", timeout_s)


def _leave_process_group(destroy: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group=destroy)
