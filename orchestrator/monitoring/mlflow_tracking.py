"""A job's run in MLflow (`tracking.mlflow` in the spec), sent by the driver: never on the
training step's path, and never able to slow or fail training.

- **One MLflow run per job**, not per attempt: its id is kept in the run folder
  (`<storage>/<run>/mlflow.json`), so each attempt (after a preemption, a requeue, a new
  driver) and a resumed `orchestrator run` carry on with it. A sweep's trials are runs of
  their own under one parent run per sweep.
- **What is sent**: the spec, flattened, as parameters (once, when the run is made); the job
  id, queue, user, team and attempt as tags; every train and eval record's numbers as
  metrics at their steps; the newest checkpoint's URI as a tag; the attempt's summary as the
  artifact `summary.json`; the run's status (RUNNING, then FINISHED, FAILED, KILLED, or
  SCHEDULED for a job back in the queue).
- **No step twice**: the run's tags hold the newest step sent of each kind, written in the same
  call as the metrics. An attempt resumed from a checkpoint redoes the steps after it; those
  already sent are not sent again, and the ones a driver that died never sent are sent from
  the history the new attempt starts with.
- **A server that is down or slow**: records wait in memory (the newest MAX_WAITING) and a
  thread of their own retries with a growing pause; one line when sending starts failing and
  one when it works again. After an attempt has been reported (its resources handed back),
  the driver waits at most CLOSE_WAIT_S for them, then stops sending: what is still unsent is
  in the metrics log, and the job's next attempt, the service (`service/mlflow_catchup.py`)
  or `orchestrator tracking sync` sends it (`mlflow_sync.py`), each step once.
"""

from __future__ import annotations

import collections
import json
import math
import os
import threading
import time
from collections.abc import Callable

from core import records, storage

RUN_FILE = "mlflow.json"
MARKS = {records.TRAIN: "orchestrator.last_train_step", records.EVAL: "orchestrator.last_eval_step"}
STATUS = {"succeeded": "FINISHED", "stopped_early": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
NOT_METRICS = {records.STEP, records.TIME, records.TOTAL_STEPS, "rank", "epoch"}
BATCH = 1000  # MLflow takes at most 1,000 metrics and 100 params or tags per call
MAX_WAITING = 100_000  # records kept while the server does not answer
PAUSES_S = (1, 2, 5, 10, 30)  # between tries while it does not
CLOSE_WAIT_S = 15.0
PARENT = "orchestrator.sweep_parent"


def for_attempt(spec, run_uri: str, run_name: str, job: dict, say) -> MlflowTracker | None:
    """The tracker of an attempt of a job with `tracking.mlflow`; `job`: what the driver knows
    of it (the service's view: id, attempt, queue, user, team, sweep; empty without a service)."""
    if spec.tracking.mlflow is None:
        return None
    tags = job_tags(run_uri, job)
    params = flat_params(spec.model_dump(mode="json", by_alias=True))
    return MlflowTracker(spec.tracking.mlflow, run_uri, run_name, tags, params, say, sweep=job.get("sweep"))


def job_tags(run_uri: str, job: dict) -> dict[str, str]:
    tags = {"orchestrator.run_uri": run_uri, "orchestrator.attempt": str(job.get("attempt", 1))}
    for field in ("id", "queue", "user", "team", "sweep"):
        if job.get(field):
            tags[f"orchestrator.{'job_id' if field == 'id' else field}"] = str(job[field])
    return tags


def flat_params(spec_json: dict, prefix: str = "") -> dict[str, str]:
    """{"model.family": "vit", ...}: the spec's settings (not the sweep or tracking sections)."""
    flat = {}
    for key, value in spec_json.items():
        name = f"{prefix}{key}"
        if name in ("sweep", "tracking") or value is None:
            continue
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return flat


def metrics_of(record: dict) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in record.items()
        if key not in NOT_METRICS
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


class MlflowTracker:
    """The job's MLflow run, for one attempt's driver. `add`, `checkpoint` and `end` only hand
    things to the sending thread, never waiting for the server; `wait` waits a bounded time,
    once the attempt is reported (a server that is down must not hold up a preemption)."""

    def __init__(
        self,
        settings,
        run_uri: str,
        run_name: str,
        tags: dict[str, str],
        params: dict[str, str],
        say: Callable[[str], None],
        sweep: str | None = None,
    ):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # this thread retries itself
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.settings, self.run_uri, self.run_name, self.say = settings, run_uri, run_name, say
        self.sweep = sweep
        self._tags, self._params = dict(tags), dict(params)
        self._waiting: collections.deque[dict] = collections.deque(maxlen=MAX_WAITING)
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._end: dict | None = None  # {"status", "summary"} once the attempt ended
        self._done = threading.Event()
        self._handed_over = threading.Event()  # gave up at the end: the metrics log's readers send the rest
        self.run_id: str | None = None
        self._marks: dict[str, int] = {}
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="mlflow", daemon=True)
        self._thread.start()

    # -- the driver's side ---------------------------------------------------------------

    def add(self, batch: list[dict]) -> None:
        kept = [r for r in batch if records.kind_of(r) in MARKS]
        if kept:
            with self._lock:
                self._waiting.extend(kept)
            self._wake.set()

    def checkpoint(self, uri: str) -> None:
        with self._lock:
            self._tags["orchestrator.checkpoint"] = uri
        self._wake.set()

    def end(self, summary: dict) -> None:
        """The attempt ended: after what waits, its summary and status are sent (`wait`)."""
        status = STATUS.get(summary.get("status"), "SCHEDULED")  # preempted, requeued: it comes back
        with self._lock:
            self._end = {"status": status, "summary": summary}
        self._wake.set()

    def wait(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Wait (at most `timeout`) until the server has everything; say what it has not."""
        if self._done.wait(timeout):
            return True
        with self._lock:
            left = len(self._waiting)
        self.say(
            f"MLflow: {self.settings.uri} did not take the run's last {left} record(s) in "
            f"{timeout:.0f} s; they are in the metrics log and are sent from there once the "
            "server answers (by the job's next attempt, the service, or `orchestrator tracking sync`)"
        )
        self._note_sent()
        self._handed_over.set()  # no second sender beside the service's catch-up or a sync
        self._wake.set()
        return False

    def _note_sent(self) -> None:
        """What the server has, in the run folder: how many records wait, while it does not answer."""
        try:
            known = read_run_file(self.run_uri)
            if known:
                _write_run_file(self.run_uri, {**known, "sent": dict(self._marks)})
        except OSError:
            pass  # a count shown, not a record kept: the run's own marks decide what is sent

    def close(self, summary: dict, timeout: float = CLOSE_WAIT_S) -> bool:
        self.end(summary)
        return self.wait(timeout)

    # -- the sending thread -----------------------------------------------------------------

    def _loop(self) -> None:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=self.settings.uri)
        pause = 0
        while not (self._done.is_set() or self._handed_over.is_set()):
            self._wake.wait(PAUSES_S[min(pause, len(PAUSES_S) - 1)] if pause else None)
            self._wake.clear()
            if self._handed_over.is_set():
                break
            try:
                if self.run_id is None:
                    self._open(client)
                while self._send(client):
                    pass
                pause = 0
                if self._failing:
                    self._failing = False
                    self.say(f"MLflow: {self.settings.uri} answers again; the waiting records were sent")
            except Exception as err:  # a server down, slow or refusing: training goes on
                pause += 1
                if not self._failing:
                    self._failing = True
                    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
                    where = self.settings.uri
                    self.say(f"MLflow: cannot send to {where} ({first}); records wait and are retried")

    def _open(self, client) -> None:
        run = open_run(client, self.settings, self.run_uri, self.run_name, self._params, self.sweep)
        self.run_id = run.info.run_id
        self._marks = {kind: int(run.data.tags[tag]) for kind, tag in MARKS.items() if tag in run.data.tags}
        if run.info.status != "RUNNING":
            client.update_run(self.run_id, status="RUNNING")

    def _send(self, client) -> bool:
        """One call's worth of waiting records and tags; True while more wait. At the end (none
        waiting) the summary and the status."""
        from mlflow.entities import Metric, RunTag

        batch, metrics, marks = [], [], dict(self._marks)
        with self._lock:
            while self._waiting and len(metrics) + len(self._waiting[0]) <= BATCH:
                record = self._waiting.popleft()
                batch.append(record)
                kind, step = records.kind_of(record), int(record[records.STEP])
                if step <= marks.get(kind, -1):
                    continue  # sent before: a resumed attempt redoes the steps after its checkpoint
                marks[kind] = step
                stamp = int(record.get(records.TIME, time.time()) * 1000)
                metrics += [Metric(k, v, stamp, step) for k, v in metrics_of(record).items()]
            tags, self._tags = self._tags, {}
            end = self._end if not self._waiting else None
        tags.update({MARKS[kind]: str(step) for kind, step in marks.items() if step != self._marks.get(kind)})
        try:
            if metrics or tags:
                client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
        except Exception:
            with self._lock:  # back at the front, in order, to be tried again
                self._waiting.extendleft(reversed(batch))
                self._tags = {**tags, **self._tags}
            raise
        self._marks = marks
        if end is not None:
            client.log_dict(self.run_id, end["summary"], "summary.json")
            client.set_terminated(self.run_id, status=end["status"])
            self._done.set()
            return False
        return bool(batch)


def open_run(client, settings, run_uri: str, run_name: str, params: dict[str, str], sweep: str | None):
    """The job's run: the one its run folder names, else a new one (and the run folder names it)."""
    known = read_run_file(run_uri)
    if known:
        return client.get_run(known["run_id"])
    experiment = _experiment_id(client, settings.experiment)
    tags = {"mlflow.runName": run_name}
    if sweep:
        tags.update({"mlflow.parentRunId": _sweep_parent(client, experiment, sweep)})
    run = client.create_run(experiment, run_name=run_name, tags=tags)
    _write_run_file(run_uri, {"run_id": run.info.run_id, "uri": settings.uri})
    _log_params(client, run.info.run_id, params)
    return run


def _experiment_id(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # made by another driver meanwhile
        return client.get_experiment_by_name(name).experiment_id


def _sweep_parent(client, experiment: str, sweep: str) -> str:
    """The sweep's parent run. Trials starting together may each make one: all of them then
    take the oldest, and the others are deleted, so the trials end up under one."""
    query = f"tags.`{PARENT}` = '{sweep}'"
    found = client.search_runs([experiment], query, order_by=["attributes.start_time ASC"])
    if not found:
        client.create_run(experiment, run_name=sweep, tags={PARENT: sweep, "mlflow.runName": sweep})
        found = client.search_runs([experiment], query, order_by=["attributes.start_time ASC"])
        for extra in found[1:]:
            try:
                client.delete_run(extra.info.run_id)
            except Exception:
                pass  # deleted by the trial that made it
    return found[0].info.run_id


def _log_params(client, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k[:250], v[:6000]) for k, v in sorted(params.items())]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100])


def read_run_file(run_uri: str) -> dict | None:
    path = storage.join(run_uri, RUN_FILE)
    if not storage.exists(path):
        return None
    fs, where = storage.resolve(path)
    with fs.open_input_stream(where) as src:
        return json.loads(src.read())


def _write_run_file(run_uri: str, body: dict) -> None:
    fs, where = storage.resolve(storage.join(run_uri, RUN_FILE))
    fs.create_dir(where.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(where) as out:
        out.write(json.dumps(body).encode())
