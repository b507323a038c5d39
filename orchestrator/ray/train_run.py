"""An attempt's Ray Train run: the trainer and the process group of its workers.

    resources       -> ScalingConfig (CPU workers with gloo, or GPU workers with NCCL), plus
                       custom resources per worker
    a placement     -> one label selector per worker, `ray.io/node-id` = the node the
                       orchestrator service counted that worker on (Ray Train V2 creates the
                       placement group itself; the selectors pin its bundles)
    checkpoint      -> RunConfig(name=<run>, storage_path, storage_filesystem) and
                       CheckpointConfig(num_to_keep=None): checkpoints land in <storage>/<run>/;
                       the workers upload and prune them (workers/ray_context.py,
                       workers/checkpoint_files.py), and Ray's own list of them is removed
                       before each run (core/run_folder.py)
    fault_tolerance -> FailureConfig(max_failures): a failed worker group restarts from the
                       newest complete checkpoint; with replica groups, one run per group, each
                       of its share of the workers, replaced by the attempt when it is lost

The trainer is Ray Train's `DataParallelTrainer` less what the product does without
(`internals.lean_trainer`), with `ProcessGroupConfig`: `TorchConfig`'s set-up with torch
imported only on the workers (`workers/ray_backend.py`), never in the attempt's controller,
which would otherwise load it (~2-3 s of CPU on the critical path of a start, ~200 MiB) to set
up a process group it never joins. Importing this module loads Ray Train (~1 s of CPU, ~65 MiB
with the pandas and Ray Data it imports): only the attempt's controller does, on a thread of
its own while it checks the job in (`orchestrator/attempt/controller.py`); the service and the
CLI never do (`launcher.py` holds what they need).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.train import BackendConfig
from ray.train.backend import Backend
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S

from core import run_folder, storage
from core.jobs import resources_for
from core.spec import JobSpec
from orchestrator.ray import internals
from orchestrator.ray.launcher import head_node_id, label_selectors

log = logging.getLogger("orchestrator")

SHUTDOWN_TIMEOUT_S = DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S


def trainer(
    spec: JobSpec,
    run: str,
    controller,
    placement: dict[str, int] | None = None,
    replica: dict | None = None,
):
    """The attempt's Ray Train trainer; `controller`: the handle the workers call. With replica
    groups, one per group (`replica`: its "group" and the "lighthouse"), of the group's workers,
    and never restarted by Ray Train: a lost group is replaced by the attempt (replica_runs.py)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from workers.ray_backend import train_worker

    # Ray Train's PreemptionWatcher (an actor per run) tells workers of draining nodes; ours do
    # not ask, and the service acts on a drain itself (checkpoint, then move: docs/cluster.md)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    res = spec.resources
    use_gpu = res.gpus_per_worker > 0
    workers = res.num_workers // spec.fault_tolerance.replica_groups
    scaling = dict(num_workers=workers, use_gpu=use_gpu, resources_per_worker=resources_for(spec))
    if placement:
        scaling["label_selector"] = label_selectors(placement)
    # a filesystem object carries what a bare URI cannot (endpoints, credentials from the URI's
    # query string); Ray then takes the path without its scheme
    fs, path = storage.resolve(spec.checkpoint.storage)
    run_folder.forget_ray_index(run_folder.run_uri(spec, run))
    config = {"spec": spec, "run": run, "controller": controller, "head_node": head_node_id()}
    config["replica"] = replica
    failures = {"max_failures": spec.fault_tolerance.max_failures}
    if replica is not None:  # a group's run ends at its first failure, a lost node's (a
        # "preemption" to Ray Train) too: the attempt starts its replacement, not Ray Train;
        # one the service did not place (`orchestrator run`) waits for room, as Ray Train's do
        failures = {"max_failures": 0, "max_preemption_failures": 0, "controller_failure_limit": 0}
        if not placement:
            failures["controller_failure_limit"] = -1  # a start that timed out is tried again
    return internals.lean_trainer()(
        train_worker,
        train_loop_config=config,
        backend_config=ProcessGroupConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=run,
            storage_path=path,
            storage_filesystem=fs,
            # Ray deletes no checkpoint: the checkpointer prunes, by one rule in every launcher
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=FailureConfig(**failures),
        ),
    )


# -- the process group -------------------------------------------------------------------------


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
        from workers.ray_backend import CudaDeviceOfRank

        return CudaDeviceOfRank

    @property
    def framework(self):
        return internals.torch_framework()

    def to_dict(self) -> dict:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class ProcessGroupBackend(Backend):
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: ProcessGroupConfig) -> None:
        from workers.ray_backend import address_and_port, join_process_group, set_distributed_env

        addr, port = worker_group.execute_single(0, address_and_port)
        worker_group.execute(set_distributed_env, addr=addr, port=port)
        world, backend, timeout = len(worker_group), backend_config.backend, backend_config.timeout_s
        joins = [
            worker_group.execute_single_async(rank, join_process_group, backend, rank, world, timeout)
            for rank in range(world)
        ]
        ray.get(joins)

    def on_shutdown(self, worker_group, backend_config) -> None:
        from workers.ray_backend import leave_process_group

        ends = worker_group.execute_async(leave_process_group, len(worker_group) > 1)
        try:  # as TorchConfig's: a rank stuck in a collective must not hold the run's end
            ray.get(ends, timeout=SHUTDOWN_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            log.warning("the workers' process group did not shut down within %s s", SHUTDOWN_TIMEOUT_S)
