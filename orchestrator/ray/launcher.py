"""Start one training run of a job on the connected Ray cluster: a Ray Train V2 `TorchTrainer`.

    resources       -> ScalingConfig (CPU workers with gloo, or GPU workers with NCCL), plus
                       custom resources per worker
    a placement     -> one label selector per worker, `ray.io/node-id` = the node the
                       orchestrator service counted that worker on (Ray Train V2 creates the
                       placement group itself; the selectors pin its bundles)
    checkpoint      -> RunConfig(name=<run>, storage_path, storage_filesystem) and
                       CheckpointConfig(num_to_keep=keep): checkpoints land in <storage>/<run>/
    fault_tolerance -> FailureConfig(max_failures): a failed worker group restarts from the
                       newest complete checkpoint

`start()` runs `fit()` in a background thread and returns a `RunHandle`: the caller reads the
run's events, asks it to stop (the workers checkpoint at the step their next sum carries the
request), waits for it, and gets its summary. Printing, exit codes and the queue are the caller's business.
"""

from __future__ import annotations

import threading

import ray

from core import storage
from core.jobs import resources_for
from core.spec import JobSpec
from orchestrator.ray.run_state import Outcome, RunState

NODE_ID_LABEL = "ray.io/node-id"  # Ray's built-in label: every node carries its own id


def label_selectors(placement: dict[str, int]) -> list[dict[str, str]]:
    """One selector per worker from {node id: workers on it}."""
    return [{NODE_ID_LABEL: node} for node, count in sorted(placement.items()) for _ in range(count)]


def trainer(spec: JobSpec, run: str, state, placement: dict[str, int] | None = None):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from workers.ray_context import train_worker

    res = spec.resources
    use_gpu = res.gpus_per_worker > 0
    scaling = dict(num_workers=res.num_workers, use_gpu=use_gpu, resources_per_worker=resources_for(spec))
    if placement:
        scaling["label_selector"] = label_selectors(placement)
    # a filesystem object carries what a bare URI cannot (endpoints, credentials from the URI's
    # query string); Ray then takes the path without its scheme
    fs, path = storage.resolve(spec.checkpoint.storage)
    return TorchTrainer(
        train_worker,
        train_loop_config={"spec": spec, "run": run, "state": state},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=run,
            storage_path=path,
            storage_filesystem=fs,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(max_failures=spec.fault_tolerance.max_failures),
        ),
    )


class RunHandle:
    def __init__(self, spec: JobSpec, run: str, placement: dict[str, int] | None = None):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.spec, self.run, self.placement = spec, run, placement
        # the run's state lives on the driver's node: losing a worker node never loses the log
        here = ray.get_runtime_context().get_node_id()
        self.state = RunState.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)
        ).remote()
        self._trainer = trainer(spec, run, self.state, placement)
        self.failure: list[BaseException] = []
        self._cursor = 0
        self._thread = threading.Thread(target=self._fit, name="ray-train-fit", daemon=True)

    def _fit(self) -> None:
        try:
            self._trainer.fit()
        except BaseException as err:  # reported in the summary, with the workers' own reason
            self.failure.append(err)

    def start(self) -> RunHandle:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

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

    def outcome(self) -> Outcome:
        return ray.get(self.state.outcome.remote())


def start(spec: JobSpec, run: str, placement: dict[str, int] | None = None) -> RunHandle:
    return RunHandle(spec, run, placement).start()


def failure_reason(err: BaseException, error: dict | None, max_failures: int) -> str:
    """One line for a run Ray gave up on: which worker died or failed, and how."""
    failures = getattr(err, "worker_failures", None) or {}  # WorkerGroupError: rank -> error
    # a dead worker shows up as a failed health check wrapping the actor's death
    died = [
        rank
        for rank, e in sorted(failures.items())
        if isinstance(getattr(e, "health_check_failure", e), ray.exceptions.RayActorError)
    ]
    if died:
        head = f"worker rank {died[0]} died (killed, out of memory or its node lost)"
    elif error:  # the failure the workers reported themselves
        head = f"rank {error['rank']}: {error['reason']}"
    else:
        lines = [line for line in str(err).splitlines() if line.strip()]
        head = " ".join(lines[:2]) if lines else type(err).__name__
    if not failures:
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
        reason = failure_reason(handle.failure[0], error, spec.fault_tolerance.max_failures)
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
    return result
