"""AttemptController: the one owner of one attempt of a job, in one process on the job's node.

Every way an attempt runs on Ray starts one: the service, for each admission of a queued job
(`service/runner.py`: a detached actor named `<job id>-a<attempt>`, in the job's package), and
`orchestrator run` on a cluster without a service (`driver.py`: an actor beside the driver,
which shows its feed). The process holds the whole attempt:

    its state       one of `states.py`'s, changed only by `_set_state`, which tells the
                    listeners (the service's record, the metrics log, MLflow, the terminal)
    its loop        `run`: `_step` until Ended, each step dispatching on the state
    the run         Ray Train's `fit()` on a thread of this process, with Ray Train's controller
                    loop in it (`train_run.trainer`), or one per replica group (`runs.py`): the
                    workers and their placement groups belong to this process, so its end
                    ends the run
    the workers     their calls (join, log, checkpoint, fail, finish, the stop flag), on the
                    actor's default thread, queued for the loop as events
    its decisions   `policy.py`, pure: what an event or a stop request leads to, the summary

When the attempt is reported the process ends (a service's), or the driver that started it
does (`orchestrator run`); a run aborted before that ends with it, workers and all.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback

import ray

from core import storage
from core.jobs import TERMINAL_VALUES
from core.run_folder import run_name
from core.spec import JobSpec
from orchestrator import client
from orchestrator.attempt import policy
from orchestrator.attempt.listeners import Feed, Listener, MetricsLog, Mlflow, ServiceRecord, Terminal
from orchestrator.attempt.runs import Runs, import_train_run
from orchestrator.attempt.states import (
    Aborting,
    CheckpointSaved,
    Ended,
    GroupChanged,
    Progress,
    RankRecord,
    Records,
    Rewound,
    RunStarted,
    Starting,
    State,
    Stopping,
    WorkerFailed,
    WorkersStarted,
    check_transition,
    name,
)
from orchestrator.ray import launcher
from orchestrator.ray.cluster import yield_to_training

POLL_S = 1.0  # how often the loop looks at the run: the progress lines, the reports
KILL_WAIT_S = 30.0  # ray.kill of this process takes milliseconds


class AttemptController:
    def __init__(self):
        yield_to_training()  # the workers' calls run on this thread; the job's ranks come first
        # Ray Train (~1 s of CPU to import) loads while the attempt checks in with the service
        threading.Thread(target=import_train_run, name="import-ray-train", daemon=True).start()
        self.state: State = Starting()
        self.path: list[tuple[str, float]] = [(name(self.state), time.time())]
        self.listeners: list[Listener] = []
        self.progress = Progress(total_steps=None)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # the workers' events, in order
        self.feed = Feed()  # what `orchestrator run` shows on its terminal
        self.runs: Runs | None = None  # Ray Train's `fit()` of each run, on threads of this process
        self.terminal: Terminal | None = None  # set when the attempt starts: it names the job
        self.record: ServiceRecord | None = None
        self.mlflow: Mlflow | None = None
        self.aborted = False  # ended at once: its workers end with this process
        # the workers' side: set by their calls
        self.groups: list[str] = []  # the placement group of each worker group, in order
        self.latest: dict[int, int] = {}  # replica group -> its newest worker group's index
        self.group_summaries: dict[int, dict] = {}  # with replica groups: each group's part
        self.led = False  # with replica groups: a group has led (and so started the run)
        self.members: dict[int, dict[int, dict]] = {}  # group -> rank -> where it runs
        self.dismissed: set[int] = set()  # worker groups told to leave (their replica group was lost)
        self.error: dict | None = None  # the first failure worth reporting
        self.workers_summary: dict | None = None  # rank 0's, at the end
        self.stop: str | None = None  # the stop rank 0 reads ("stop" or "preempt")

    # -- the attempt ---------------------------------------------------------------------------

    @ray.method(concurrency_group="attempt")
    def run(self, spec: JobSpec | str, job_id: str | None = None) -> dict:
        """The attempt of `job_id` the service admitted (`spec`: the path of the spec stored in
        the job's package), or, without `job_id`, of `spec` alone; returns its summary."""
        from core.spec import load_stored

        sys.stderr = sys.stdout  # one log, in order: `orchestrator logs` reads the process's stdout
        yield_to_training()  # this thread (and `fit()`'s, which it starts) is bookkeeping
        spec = load_stored(spec) if isinstance(spec, str) else spec
        self.terminal = Terminal(spec.name, spec.train.steps, [self._log_screen(), self.feed])
        try:
            if job_id is None:
                summary = self._attempt(spec, run_name(spec), None, None, {})
                self._let_mlflow_finish()
                return summary
            return self._for_service(spec, job_id)
        except BaseException:  # the service sees the process end; the reason goes to its log
            traceback.print_exc()
            raise
        finally:
            if job_id is not None:
                self._end_process()

    def _for_service(self, spec: JobSpec, job_id: str) -> dict:
        """Attached to the service's record: checked, run as admitted, reported."""
        service = client.find()
        if service is None:
            raise client.ServiceError("no orchestrator service on this cluster")
        view = client.call(service.attach, job_id, None)
        run, uri = view["run"], storage.join(spec.checkpoint.storage, view["run"])
        self.terminal.say(f"attempt {view['attempt']} of {job_id}; checkpoints in {uri}")
        try:
            launcher.preflight(spec, uri)
        except OSError as err:  # no retry can mend it: the job fails now, with the reason
            reason = str(err).splitlines()[0]
            client.call(service.fail, job_id, reason)
            summary = policy.not_run(spec.name, run, "failed", reason)
            print_report(summary)
            return summary
        admitted = client.call(service.admission, job_id)
        if admitted["state"] in TERMINAL_VALUES:  # stopped before this process started
            return policy.not_run(spec.name, run, admitted["state"], "ended before it started")
        record = ServiceRecord(service, job_id, admitted["attempt"])
        if admitted["state"] == "stopping":  # stopped or preempted before its run started
            status = "preempted" if admitted["stop"] == "preempt" else "stopped"
            summary = policy.not_run(spec.name, run, status, f"{status} before it started")
            self._after_report(summary, record.finished(summary))
            return summary
        spec = self._as_admitted(spec, admitted)
        summary = self._attempt(spec, run, admitted["placement"], record, view)
        self._after_report(summary, record.finished(summary))
        return summary

    def _as_admitted(self, spec: JobSpec, admitted: dict) -> JobSpec:
        spec = spec.model_copy(deep=True)
        if spec.resources.elastic:  # the size the service admitted it at
            spec = spec.at_size(sum(admitted["placement"].values()))
        if admitted["attempt"] > 1:  # a later admission continues the job's own checkpoints
            spec.checkpoint.resume = "auto"
        accum = f", {spec.train.grad_accum} micro-batches per step" if spec.resources.elastic else ""
        self.terminal.say(
            f"admitted (attempt {admitted['attempt']}): {spec.resources.num_workers} "
            f"worker(s) on {len(admitted['placement'])} node(s){accum}"
        )
        self.terminal.update(state="admitted", note=None)
        return spec

    def _attempt(self, spec: JobSpec, run: str, placement, record: ServiceRecord | None, job: dict) -> dict:
        """Run it: the listeners set up, `fit()` started, the loop until the run has ended."""
        from orchestrator.monitoring import mlflow_tracking

        uri = storage.join(spec.checkpoint.storage, run)
        if record is None:  # alone: checked here (the service's attempts are checked before)
            try:
                launcher.preflight(spec, uri)
            except OSError as err:
                return policy.not_run(spec.name, run, "failed", str(err).splitlines()[0])
        self.spec, self.run_name, self.record = spec, run, record
        self.progress = Progress(total_steps=spec.train.steps)
        tracker = mlflow_tracking.for_attempt(spec, uri, run, job, self.terminal.say)
        self.mlflow = Mlflow(tracker) if tracker is not None else None
        extra = [listener for listener in (record, self.mlflow) if listener is not None]
        self.listeners = [self.terminal, MetricsLog(uri, spec.metrics.tensorboard), *extra]
        self._start_fit(spec, run, placement)
        while not isinstance(self.state, Ended):
            self._step()
        return self.state.summary

    def _step(self) -> None:
        """One turn of the loop, by state: an aborted run ends at once; any other takes the
        workers' events, ends when `fit()` has returned, else reports (the service's reply may
        ask it to stop)."""
        if isinstance(self.state, Aborting):  # its workers end with this process
            self._end(policy.aborted_summary(self.state, self.progress, self.spec.name, self.run_name))
            return
        self.runs.join(POLL_S)
        self._take_events()
        if not self.runs.alive():
            self._take_events()  # what the workers said before fit() returned
            if self.record is not None:
                self.record.report(self.progress, final=True)
            self._end(self._ended_summary())
        elif self.record is not None:
            request = self.record.report(self.progress)
            self._follow(self.record.group_placements)
            if request is not None:
                self._set_state(policy.after_stop_request(self.state, request))
        elif self.fatal() is None:  # no service places a lost replica group: Ray does
            self.runs.replace_lost()

    def _follow(self, placements: list[dict[str, int]] | None) -> None:
        """The service's placement of the replica groups: a group judged lost is told to leave
        (its newest worker group), a lost one placed again starts there."""
        for replica in self.runs.follow(placements):
            if replica in self.latest:
                self.dismissed.add(self.latest[replica])

    def _ended_summary(self) -> dict:
        replicas = self.runs.groups > 1  # a replaced group is no restart
        worker_groups = 1 if replicas else len(self.groups)
        end = policy.RunEnd(self.workers_summary, self.error, self.runs.failure(), worker_groups)
        max_failures = self.spec.fault_tolerance.max_failures
        summary = policy.ended_summary(end, self.progress, self.spec.name, self.run_name, max_failures)
        if replicas:
            summary["replica_groups"] = [self.group_summaries[g] for g in sorted(self.group_summaries)]
        return summary

    def _take_events(self) -> None:
        while True:
            try:
                event = self.inbox.get_nowait()
            except queue.Empty:
                return
            self.progress.apply(event)
            for listener in self.listeners:
                listener.event(event, self.progress)
            self._set_state(policy.after_event(self.state, event))

    def _end(self, summary: dict) -> None:
        self.aborted = isinstance(self.state, Aborting)
        self._set_state(Ended({**summary, "phases": [*self.path, ("ended", time.time())]}))

    def _set_state(self, after: State) -> None:
        """The one place the attempt's state changes: checked against its table, the stop flag
        the workers read set with it, every listener told."""
        before = self.state
        if after == before:
            return
        check_transition(before, after)
        self.state = after
        if type(after) is not type(before):
            self.path.append((name(after), time.time()))
        if isinstance(after, Stopping):
            self.stop = after.request
        for listener in self.listeners:
            listener.state_changed(before, after, self.progress)

    def _start_fit(self, spec: JobSpec, run: str, placement: dict[str, int] | None) -> None:
        """Ray Train's `fit()` on threads of this process (one per replica group); this actor
        is the workers' controller."""
        self.runs = Runs(spec, run, ray.get_runtime_context().current_actor, self.inbox.put)
        self.runs.start(placement)

    def _after_report(self, summary: dict, after: dict) -> None:
        """The service's verdict said, the summary printed, MLflow given its time."""
        if after["state"] not in TERMINAL_VALUES:
            self.terminal.requeued(after, summary)
        print_report(summary)
        self._let_mlflow_finish()

    def _let_mlflow_finish(self) -> None:
        """A bounded wait for MLflow to have all of the attempt (not after an abort: what it
        lacks, the job's next attempt sends)."""
        if self.mlflow is not None and not self.aborted:
            self.mlflow.wait()

    def _log_screen(self):
        from orchestrator.monitoring.terminal import Display

        return Display(live=False)

    def _end_process(self) -> None:
        """End this process, and with it an aborted run's controller loop and workers."""
        sys.stdout.flush()
        if self.runs is not None and self.runs.alive():
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
            time.sleep(KILL_WAIT_S)
        ray.actor.exit_actor()

    # -- `orchestrator run`'s terminal -----------------------------------------------------------

    def feed_since(self, cursor: int) -> tuple[list, int]:
        return self.feed.since(cursor)

    # -- the workers' calls ----------------------------------------------------------------------

    def join(
        self, group: str, rank: int, world_size: int, pid: int, node: str, node_id: str, replica: int = 0
    ) -> int:
        """A worker of replica group `replica` started; returns its worker group's number (0
        for the first)."""
        if group not in self.groups:
            self.groups.append(group)
        index = self.groups.index(group)
        self.latest[replica] = index
        members = self.members.setdefault(index, {})
        members[rank] = {"pid": pid, "node": node, "node_id": node_id}
        if len(members) == world_size:
            if self.runs is not None and self.runs.groups > 1:
                nodes = sorted({m["node_id"] for m in members.values()})
                joined = {"state": "training", "joined_at": time.time(), "nodes": nodes}
                self.inbox.put(GroupChanged(replica, joined))
            self.inbox.put(WorkersStarted(index, dict(sorted(members.items())), replica))
        return index

    def healed(self, replica: int, step: int, at: float) -> None:
        """Replica group `replica` loaded a peer's state and trains on from `step`."""
        self.inbox.put(GroupChanged(replica, {"healed_step": step, "healed_at": at}))

    def restore(self, group: int, history: list[dict], resumed: dict | None = None) -> None:
        """The group (re)started from a checkpoint holding `history`, or from scratch ([]);
        `resumed` says which checkpoint, and which newer ones were skipped as incomplete."""
        if not self._current(group):
            return
        resumed = resumed or {}
        # the checkpoint's own step: its log may end a few steps earlier, at the last logged one
        steps = [r["step"] for r in history if "step" in r]
        step = resumed["step"] if resumed.get("checkpoint") else max(steps, default=0)
        self.inbox.put(Rewound(list(history)))
        self.inbox.put(RunStarted(group, step, resumed.get("checkpoint"), resumed.get("skipped") or []))

    def lead(self, group: int, history: list[dict], resumed: dict | None = None) -> None:
        """With replica groups: worker group `group` leads now and writes the job's log from
        `history` on; the first to lead started the run (from `resumed`'s checkpoint, or 0)."""
        if not self._current(group):
            return
        self.inbox.put(Rewound(list(history)))
        if not self.led:
            self.led = True
            resumed = resumed or {}
            step = resumed["step"] if resumed.get("checkpoint") else 0
            self.inbox.put(RunStarted(group, step, resumed.get("checkpoint"), resumed.get("skipped") or []))

    def log(self, group: int, records: list[dict], durable: bool = False) -> None:
        """Rank 0's records; `durable`: in the log in storage at once, not at its next flush."""
        if self._current(group):  # else: from a worker group that has since been replaced
            self.inbox.put(Records(records, durable))

    def log_rank(self, group: int, rank: int, record: dict) -> None:
        if self._current(group):
            self.inbox.put(RankRecord(rank, record))

    def checkpoint(self, group: int, step: int, uri: str) -> None:
        self.inbox.put(CheckpointSaved(step, uri))

    def fail(self, rank: int, reason: str, retry: bool) -> None:
        if self.error is None or (not retry and self.error["retry"]):
            self.error = {"rank": rank, "reason": reason, "retry": retry}
        self.inbox.put(WorkerFailed(rank, reason, retry))

    def fatal(self) -> str | None:
        """The reason of a failure not worth retrying, if there was one."""
        return self.error["reason"] if self.error and not self.error["retry"] else None

    def stop_requested(self, group: int | None = None) -> str | None:
        """What worker group `group`'s rank 0 is to do: "leave" (its replica group was judged
        lost: the others train on without it), or the attempt's stop request, if any."""
        return "leave" if group in self.dismissed else self.stop

    def finish(self, summary: dict, group: int | None = None) -> None:
        if group in self.dismissed:  # a group that left: the attempt's summary is the others'
            return
        part = summary.get("replica_group")
        if part is not None:  # each group's rank 0 reports; the groups trained the same steps
            self.group_summaries[part["group"]] = part
            if self.workers_summary is not None and summary["status"] == "failed":
                return
        self.workers_summary = summary

    def _current(self, group: int) -> bool:
        """Whether worker group `group` is the newest of its replica group (else it was replaced)."""
        return group in self.latest.values()


def print_report(summary: dict) -> None:
    """The attempt's summary as a person reads it at the end of a log."""
    from core.summary import print_summary

    job = summary["job"]
    if summary.get("steps") is not None:
        print_summary(summary)
    if summary.get("restarts"):
        print(f"[{job}] restarts: {summary['restarts']} (resumed from checkpoints)", flush=True)
    if summary["status"] == "failed":
        print(f"error: {job}: {summary['reason']}", file=sys.stderr, flush=True)


# the attempt's loop has a thread of its own; the workers' calls share the default one
AttemptControllerActor = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={"attempt": 1})(
    AttemptController
)
