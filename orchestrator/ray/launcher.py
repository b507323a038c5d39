"""Start one training run of a job on the connected Ray cluster: a Ray Train V2 `TorchTrainer`.

    resources       -> ScalingConfig (CPU workers with gloo, or GPU workers with NCCL), plus
                       custom resources per worker
    a placement     -> one label selector per worker, `ray.io/node-id` = the node the
                       orchestrator service counted that worker on (Ray Train V2 creates the
                       placement group itself; the selectors pin its bundles)
    checkpoint      -> RunConfig(name=<run>, storage_path, storage_filesystem) and
                       CheckpointConfig(num_to_keep=None): checkpoints land in <storage>/<run>/;
                       the workers prune them (workers/checkpoint_files.py), and Ray's own
                       list of them is removed before each run (core/run_folder.py)
    fault_tolerance -> FailureConfig(max_failures): a failed worker group restarts from the
                       newest complete checkpoint

`start()` runs `fit()`, and Ray Train's controller loop with it, in the run's state actor
(`run_state.RunState`) on the job's node and returns a `RunHandle`: the caller reads the run's
events, asks it to stop (the workers checkpoint at the step their next sum carries the
request) or aborts it (the actor and all the run's processes end at once), waits for it, and
gets its summary. Printing, exit codes and the queue are the caller's business.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os

import ray

from core import run_folder, storage
from core.jobs import resources_for
from core.spec import JobSpec
from orchestrator.ray.run_state import Outcome, RunStateActor

log = logging.getLogger("orchestrator")

NODE_ID_LABEL = "ray.io/node-id"  # Ray's built-in label: every node carries its own id


def driver_node(placement: dict[str, int]) -> str | None:
    """The node a job's control runs on (its driver, the run's state actor and Ray Train's
    controller): the one with the most of its workers (rank 0's on a tie)."""
    if not placement:
        return None
    return max(sorted(placement), key=lambda node: placement[node])


def label_selectors(placement: dict[str, int]) -> list[dict[str, str]]:
    """One selector per worker from {node id: workers on it}."""
    return [{NODE_ID_LABEL: node} for node, count in sorted(placement.items()) for _ in range(count)]


def trainer(spec: JobSpec, run: str, state, placement: dict[str, int] | None = None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

    from workers.ray_backend import ProcessGroupConfig, train_worker

    # Ray Train's PreemptionWatcher (an actor per run) tells workers of draining nodes; ours do
    # not ask, and the service acts on a drain itself (checkpoint, then move: docs/cluster.md)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    res = spec.resources
    use_gpu = res.gpus_per_worker > 0
    scaling = dict(num_workers=res.num_workers, use_gpu=use_gpu, resources_per_worker=resources_for(spec))
    if placement:
        scaling["label_selector"] = label_selectors(placement)
    # a filesystem object carries what a bare URI cannot (endpoints, credentials from the URI's
    # query string); Ray then takes the path without its scheme
    fs, path = storage.resolve(spec.checkpoint.storage)
    run_folder.forget_ray_index(run_folder.run_uri(spec, run))
    return trainer_class()(
        train_worker,
        train_loop_config={"spec": spec, "run": run, "state": state, "head_node": head_node_id()},
        backend_config=ProcessGroupConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=run,
            storage_path=path,
            storage_filesystem=fs,
            # Ray deletes no checkpoint: the checkpointer prunes, by one rule in every launcher
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=FailureConfig(max_failures=spec.fault_tolerance.max_failures),
        ),
    )


def head_node_id() -> str | None:
    """The cluster's head node (Ray gives only the head `node:__internal_head__`): CPU ranks
    there train in the background (workers/cpu_priority.py)."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def trainer_class():
    """Ray Train's `TorchTrainer` less torch in its control processes and three things it starts
    for every run that the product does without (tests/test_service.py checks none runs):

    - torch, in the process that calls `fit()` and in Ray Train's controller: its data-parallel
      trainer with `workers.ray_backend.ProcessGroupConfig`, `TorchConfig`'s set-up with torch
      imported on the workers only (docs/ray.md, Start-up).

    - the PlacementGroupCleaner, a detached actor pinned to the head node (100-300 MiB there per
      running job: docs/scaling.md) that removes the run's placement groups if the run's
      controller dies. Here the run's state actor owns the controller, and whoever loses that
      actor removes them (`RunHandle.join`); Ray removes them with the driver's job in any case.
    - the requests of its scaling policy to the autoscaler, through the cluster's one
      AutoscalingCoordinator: a detached actor it creates on the first controller's node and
      pins there for good (a worker node the autoscaler then never finds idle), and whose
      requests replace the one the service keeps standing for its queue. The service admits a
      run only onto nodes that are there, and asks the autoscaler for what the queue needs.
    - the DatasetManager, an actor (a process of its own, ~200 MiB, ~1-2 s of CPU to start) that
      splits Ray Data datasets between the workers: started for every run, datasets or none.
      The workers read their data themselves (workers/data/); no run passes Ray datasets.

    - the `TrainController` actor: a process of its own (~250 MiB, ~1 s of the start) whose
      whole job is an asyncio loop that polls the workers. It runs in the process that calls
      `fit()` instead (`run_controller_here`), the run's state actor, which owned it anyway:
      killing that actor still ends the controller, the workers and their placement group.

    Ray Train has no switch for any: the trainer's default callbacks are filtered, its
    fixed-size policy is given without the requests, and its controller is run, not started."""
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    class FixedSizeWithoutAutoscalerRequests(FixedScalingPolicy):
        def after_controller_start(self, train_run_context) -> None:
            pass

        def _maybe_send_resource_request(self) -> None:
            pass

        def _cancel_resource_request(self) -> None:
            pass

    class Trainer(DataParallelTrainer):
        def _create_default_callbacks(self):
            defaults = super()._create_default_callbacks()
            unused = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
            return [c for c in defaults if not isinstance(c, unused)]

        def _initialize_and_run_controller(self, **kwargs):
            kwargs["scaling_policy"] = FixedSizeWithoutAutoscalerRequests(self.scaling_config)
            return run_controller_here(kwargs)

    return Trainer


def run_controller_here(controller_kwargs: dict):
    """Ray Train's controller loop in this process, where `fit()` would start it as an actor of
    its own and block on it: the same loop, states and result, one process less. The workers
    get this process's actor as their controller (they ask it nothing: the product does not
    call `ray.train.get_all_reported_checkpoints`)."""
    from ray.train.v2._internal.execution.controller import TrainController

    controller = TrainController(**controller_kwargs)
    asyncio.run(controller.run())
    return controller.get_result()


class RunHandle:
    def __init__(self, spec: JobSpec, run: str, placement: dict[str, int] | None = None, state=None):
        """`state`: the run state to run `fit()` in, when the caller is one (the service's
        attempt controller: `orchestrator.attempt_controller`); else an actor of its own is
        started for the run."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.spec, self.run, self.placement = spec, run, placement
        self.owns_state = state is None
        if state is None:
            # the run's state actor, which runs fit() and Ray Train's controller loop, lives
            # on the job's own node where the service placed it, else on the driver's
            node = driver_node(placement or {}) or ray.get_runtime_context().get_node_id()
            here = NodeAffinitySchedulingStrategy(node, soft=False)
            state = RunStateActor.options(scheduling_strategy=here).remote()
        self.state = state
        self._result = self.state.fit.remote(functools.partial(trainer, spec, run, placement=placement))
        self._outcome: Outcome | None = None  # read before an abort ends the actor
        self._failure: dict | None = None
        self._done = False
        self.aborted: str | None = None  # why the run was aborted, if it was
        self._cursor = 0

    @property
    def running(self) -> bool:
        self.join(0)
        return not self._done

    def join(self, timeout: float) -> None:
        if not self._done and ray.wait([self._result], timeout=timeout)[0]:
            self._done = True
            try:
                self._failure = ray.get(self._result)
            except ray.exceptions.RayActorError:  # aborted, or the run's node went away
                self._failure = {"died": [], "text": self.aborted or "the run's actor died", "group": False}
                if not self.aborted:  # (abort removes them itself)
                    release_placement_groups()

    @property
    def failure(self) -> dict | None:
        """How `fit()` failed (see `run_state.describe_failure`), or None."""
        return self._failure

    def events(self, timeout: float = 30.0) -> list:
        """What happened since the last call (see run_state's event classes)."""
        try:
            events, self._cursor = ray.get(self.state.events_since.remote(self._cursor), timeout=timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return []
        return events

    def request_stop(self, reason: str) -> None:
        """ "preempt" or "stop": the workers checkpoint at the step they next learn of it, and end."""
        self.state.request_stop.remote(reason)

    def abort(self, why: str, timeout: float = 30.0) -> None:
        """End the run now, without a checkpoint: its controller and workers go with the actor
        that owns them, and its placement group is removed here. A run in the caller's own
        process (the attempt controller) ends with that process, once the attempt is reported
        (`AttemptController.run`)."""
        self.aborted = why
        try:
            self._outcome = ray.get(self.state.outcome.remote(), timeout=10)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            pass
        if not self.owns_state:
            self._done, self._failure = True, {"died": [], "text": why, "group": False}
            return
        ray.kill(self.state, no_restart=True)
        self.join(timeout)
        release_placement_groups()

    def outcome(self) -> Outcome:
        return self._outcome or ray.get(self.state.outcome.remote())

    @property
    def known_outcome(self) -> Outcome | None:
        """The outcome read before an abort ended the actor, if it could be."""
        return self._outcome


def release_placement_groups() -> list[str]:
    """Remove this Ray job's placement groups (a placement group's id ends with its job's):
    after an abort, those of the run just ended, since a driver runs one at a time. Ray Train
    leaves that to its PlacementGroupCleaner, which looks the dead controller up through the
    state API and gives up on a machine that runs more than one Ray cluster ("Found multiple
    active Ray instances"): the reservation then held the job's next attempt off its nodes
    until the driver exited. Returns the ids removed."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    job = ray.get_runtime_context().get_job_id()
    removed = []
    for pg_id, info in placement_group_table().items():
        if info["state"] == "REMOVED" or not pg_id.endswith(job):
            continue
        try:
            remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(pg_id)))
            removed.append(pg_id)
        except Exception as err:  # removed meanwhile (Ray Train's cleaner), or the GCS is busy
            log.warning("could not remove placement group %s: %s", pg_id, err)
    return removed


def start(spec: JobSpec, run: str, placement: dict[str, int] | None = None, state=None) -> RunHandle:
    return RunHandle(spec, run, placement, state)


def failure_reason(failure: dict, error: dict | None, max_failures: int) -> str:
    """One line for a run Ray gave up on: which worker died or failed, and how."""
    if failure["died"]:
        head = f"worker rank {failure['died'][0]} died (killed, out of memory or its node lost)"
    elif error:  # the failure the workers reported themselves
        head = f"rank {error['rank']}: {error['reason']}"
    else:
        head = failure["text"]
    if not failure["group"]:
        return head
    return head + f"; no restarts left (fault_tolerance.max_failures: {max_failures})"


def summary(handle: RunHandle, last_step: int | None, last_checkpoint: str | None) -> dict:
    """The run's summary: the workers' own, or one that says why there is none."""
    spec, outcome = handle.spec, handle.outcome()
    error, result = outcome.error, outcome.summary
    reason = None  # why the run failed, in the workers' own words where they gave them
    if error and not error["retry"]:
        reason = f"rank {error['rank']}: {error['reason']}"
    elif handle.failure:  # Ray gave up: out of restarts, or a failure outside the training function
        reason = failure_reason(handle.failure, error, spec.fault_tolerance.max_failures)
    elif result is None:
        reason = "the workers stopped without a result"
    if reason is not None and (result is None or result["status"] != "failed"):
        result = {
            "job": spec.name,
            "run": handle.run,
            "status": "failed",
            "reason": reason,
            "steps": last_step,
            "checkpoint": last_checkpoint,
            "samples_per_s": 0.0,
        }
    result.update(restarts=max(outcome.attempts - 1, 0), resumed_from_step=outcome.resumed_from)
    if result["status"] == "failed":  # one the workers did not call final may be its node's doing
        result["retryable"] = not (error and not error["retry"])
        result["infrastructure"] = result["retryable"] and collective_failure(handle.failure, error)
    return result


# What a rank's collectives say when a peer went away or the network between them broke
# (gloo, NCCL, Ray's actor death): the cluster's doing, not the job's (docs/cluster.md).
COLLECTIVE_SIGNS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "gloo",
    "nccl",
    "distbackenderror",
    "collective operation timeout",
    "actor died",
    "actordiederror",
    "rayactorerror",
)


def collective_failure(failure: dict | None, error: dict | None) -> bool:
    """Whether a failed run failed in its collectives: a rank died, or a rank's error (or Ray's
    account of the failure) is a peer reset, a gloo or NCCL error or a rank gone."""
    if failure and failure.get("died"):
        return True
    texts = [(error or {}).get("reason") or "", (failure or {}).get("text") or ""]
    return any(sign in text.lower() for text in texts for sign in COLLECTIVE_SIGNS)


def aborted_summary(
    handle: RunHandle, status: str, last_step: int | None, last_checkpoint: str | None
) -> dict:
    """The summary of a run ended by `abort`: `status` is stopped or preempted (before its first
    step) or aborted (requeued by the service)."""
    known = handle.known_outcome  # the actor is gone: what it said before the abort
    resumed = known.resumed_from if known else None
    return {
        "job": handle.spec.name,
        "run": handle.run,
        "status": status,
        "reason": handle.aborted,
        "steps": last_step,
        "checkpoint": last_checkpoint,
        "samples_per_s": 0.0,
        "restarts": 0,
        "resumed_from_step": resumed,
    }
