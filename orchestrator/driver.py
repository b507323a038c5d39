"""`orchestrator run` on Ray: a validated spec becomes one Ray Train V2 `TorchTrainer` run.

    resources       -> ScalingConfig (CPU workers with gloo, or GPU workers with NCCL)
    checkpoint      -> RunConfig(name=<run>, storage_path, storage_filesystem) and
                       CheckpointConfig(num_to_keep=keep): checkpoints land in <storage>/<run>/
    fault_tolerance -> FailureConfig(max_failures): a failed worker group restarts from the
                       newest registered checkpoint

`fit()` runs in a background thread while this thread polls the `MetricsSink` actor, prints
progress and keeps `<storage>/<run>/metrics.jsonl` current. Returns the exit status.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time

from orchestrator import cluster
from orchestrator.spec import JobSpec
from workers import storage
from workers.context import run_name
from workers.run import print_summary, write_summary

POLL_S = 1.0  # progress lines once a second; each poll is an actor call
REMOTE_METRICS_EVERY_S = 10.0  # rewriting an object per poll would be wasteful


def run(spec: JobSpec, address: str | None = None, summary_path: str | None = None) -> int:
    if "://" not in spec.checkpoint.storage:  # workers run in other directories
        spec.checkpoint.storage = os.path.abspath(os.path.expanduser(spec.checkpoint.storage))
    run = run_name(spec)  # once, here: every worker and every restart must agree on it
    run_uri = storage.join(spec.checkpoint.storage, run)
    try:
        _preflight(spec, run_uri)
        address = cluster.driver_address(address)
        needed_cpus = math.ceil(spec.resources.num_workers * spec.resources.cpus_per_worker)
        with cluster.connect(address, num_cpus=needed_cpus) as where:
            if threading.current_thread() is threading.main_thread():
                # after ray.init, whose own SIGTERM handler would end the process mid-C++
                signal.signal(signal.SIGTERM, _raise_stopped)
            _check_resources(spec, local=address is None)
            print(
                f"[{spec.name}] {spec.resources.num_workers} worker(s) on {where}; checkpoints in {run_uri}",
                flush=True,
            )
            summary = _fit(spec, run, run_uri)
    except (cluster.ClusterError, OSError) as err:
        print(f"error: {spec.name}: {err}", file=sys.stderr, flush=True)
        return 1
    except Stopped:
        print(
            f"error: {spec.name}: stopped (SIGTERM); its checkpoints stay in {run_uri}",
            file=sys.stderr,
            flush=True,
        )
        return 128 + signal.SIGTERM
    write_summary(summary, summary_path)
    if summary.get("steps") is not None:
        print_summary(summary)
    if summary.get("restarts"):
        print(f"[{spec.name}] restarts: {summary['restarts']} (resumed from checkpoints)", flush=True)
    if summary["status"] == "failed":
        print(f"error: {spec.name}: {summary['reason']}", file=sys.stderr, flush=True)
        return 1
    return 0


class Stopped(Exception):
    """SIGTERM, e.g. from `orchestrator stop`: leave through ray.shutdown(), not mid-C++."""


def _raise_stopped(signum, frame):
    raise Stopped()


def _preflight(spec: JobSpec, run_uri: str) -> None:
    """Fail before any worker starts when storage is unusable (the message names the URI)."""
    storage.check_writable(run_uri)
    resume = spec.checkpoint.resume
    if resume not in ("auto", "never"):
        try:
            found = storage.exists(storage.join(resume, "trainer.pt"))
        except Exception as err:
            raise OSError(f"checkpoint.resume: cannot read '{resume}': {err}") from None
        if not found:
            raise OSError(f"checkpoint.resume: no checkpoint at '{resume}'")


def _check_resources(spec: JobSpec, local: bool) -> None:
    import ray

    gpus = spec.resources.num_workers * spec.resources.gpus_per_worker
    have = ray.cluster_resources().get("GPU", 0)
    if gpus > have:
        text = f"resources: the job asks for {gpus:g} GPU(s) and the cluster has {have:g}"
        if local:
            raise cluster.ClusterError(text + "; set resources.gpus_per_worker=0 to train on CPUs")
        print(f"[{spec.name}] warning: {text}; waiting for the autoscaler", flush=True)


def _trainer(spec: JobSpec, run: str, sink):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from orchestrator.ray_context import train_worker

    res = spec.resources
    use_gpu = res.gpus_per_worker > 0
    per_worker = {"CPU": res.cpus_per_worker, **({"GPU": res.gpus_per_worker} if use_gpu else {})}
    # a filesystem object carries what a bare URI cannot (endpoints, credentials from the
    # URI's query string); Ray then takes the path without its scheme
    fs, path = storage.resolve(spec.checkpoint.storage)
    return TorchTrainer(
        train_worker,
        train_loop_config={"spec": spec, "run": run, "sink": sink},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=res.num_workers, use_gpu=use_gpu, resources_per_worker=per_worker
        ),
        run_config=RunConfig(
            name=run,
            storage_path=path,
            storage_filesystem=fs,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(max_failures=spec.fault_tolerance.max_failures),
        ),
    )


def _fit(spec: JobSpec, run: str, run_uri: str) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.metrics_sink import MetricsSink

    # the sink lives on the driver's node, so losing a worker node never loses the log
    here = ray.get_runtime_context().get_node_id()
    sink = MetricsSink.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
    trainer = _trainer(spec, run, sink)
    failure: list[BaseException] = []

    def fit():
        try:
            trainer.fit()
        except BaseException as err:  # reported below, with the workers' own reason
            failure.append(err)

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
    thread.start()
    monitor = Monitor(spec, run_uri, sink)
    while thread.is_alive():
        thread.join(POLL_S)
        monitor.poll()
    monitor.poll(final=True)
    return _summary(spec, run, ray.get(sink.outcome.remote()), failure, monitor)


def _summary(spec: JobSpec, run: str, outcome: dict, failure: list, monitor: Monitor) -> dict:
    error, summary = outcome["error"], outcome["summary"]
    reason = None  # why the run failed, in the workers' own words where they gave them
    if error and not error["retry"]:
        reason = f"rank {error['rank']}: {error['reason']}"
    elif failure:  # Ray gave up: out of restarts, or a failure outside the training function
        reason = _failure_reason(failure[0], error, spec.fault_tolerance.max_failures)
    elif summary is None:
        reason = "the workers stopped without a result"
    if reason is not None and (summary is None or summary["status"] != "failed"):
        summary = {
            "job": spec.name,
            "run": run,
            "status": "failed",
            "reason": reason,
            "steps": monitor.last_step,
            "checkpoint": monitor.last_checkpoint,
            "samples_per_s": 0.0,
        }
    summary.update(restarts=max(outcome["attempts"] - 1, 0), resumed_from_step=outcome["resumed_from"])
    return summary


def _failure_reason(err: BaseException, error: dict | None, max_failures: int) -> str:
    """One line for a run Ray gave up on: which worker died or failed, and how."""
    import ray.exceptions

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


class Monitor:
    """Turns the sink's events into progress lines and keeps metrics.jsonl in storage."""

    def __init__(self, spec: JobSpec, run_uri: str, sink):
        self.spec, self.sink = spec, sink
        self.metrics_uri = storage.join(run_uri, "metrics.jsonl")
        self.remote = not storage.is_local(run_uri)
        self.cursor = self.version = 0
        self.last_write = 0.0
        self.pending: list | None = None
        self.last_step: int | None = None
        self.last_checkpoint: str | None = None
        self.tag = f"[{spec.name}]"

    def poll(self, final: bool = False) -> None:
        import ray

        try:
            state = ray.get(self.sink.poll.remote(self.cursor, self.version), timeout=30)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return
        self.cursor, self.version = state["cursor"], state["version"]
        for event in state["events"]:
            self._show(event)
        if state["records"] is not None:
            self.pending = state["records"]
        if self.pending is not None and (
            final or not self.remote or time.time() - self.last_write > REMOTE_METRICS_EVERY_S
        ):
            self._write(self.pending)
            self.pending, self.last_write = None, time.time()

    def _write(self, records: list[dict]) -> None:
        fs, path = storage.resolve(self.metrics_uri)
        with fs.open_output_stream(path) as out:
            out.write("".join(json.dumps(r) + "\n" for r in records).encode())

    def _show(self, event: tuple) -> None:
        kind = event[0]
        if kind == "workers":
            _, attempt, members = event
            who = ", ".join(f"rank {rank} pid {w['pid']} on {w['node']}" for rank, w in members.items())
            label = "workers" if attempt == 0 else f"restart {attempt}: workers"
            print(f"{self.tag} {label}: {who}", flush=True)
        elif kind == "start":
            _, attempt, step = event
            if attempt:
                print(
                    f"{self.tag} restarted from the checkpoint at step {step}"
                    if step
                    else f"{self.tag} restarted from scratch (no checkpoint yet)",
                    flush=True,
                )
            elif step:
                print(f"{self.tag} resuming at step {step}", flush=True)
        elif kind == "checkpoint":
            _, step, uri = event
            self.last_checkpoint = uri
            print(f"{self.tag} checkpoint at step {step}: {uri}", flush=True)
        elif kind == "record":
            self._show_record(event[1])

    def _show_record(self, r: dict) -> None:
        step = r.get("step")
        self.last_step = step
        if "loss" in r:
            total = f"/{self.spec.train.steps}" if self.spec.train.steps else ""
            print(
                f"{self.tag} step {step}{total}  loss {r['loss']:.4f}  "
                f"{r.get('samples_per_s', 0):,.0f} samples/s  lr {r.get('lr', 0):.2e}",
                flush=True,
            )
        else:
            evals = "  ".join(
                f"{k.removeprefix('eval_')} {v:.4f}"
                for k, v in r.items()
                if k.startswith("eval_") and isinstance(v, (int, float))
            )
            print(f"{self.tag} eval at step {step}: {evals}", flush=True)
