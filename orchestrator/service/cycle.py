"""One scheduling pass of the service, every `tick_s`:

1. read the cluster's live nodes from Ray's node table, probe them (`policy/node_watch.py`) and hand
   the policy those that answer and are not in doubt;
2. reconcile the job table with the cluster: a job on a node that died or does not answer goes
   back to its place in the queue (a job of replica groups trains on while a group is left,
   and its lost groups are placed again before any waiting job); a driver that died, workers
   that did not start in time, a victim that did not stop within its grace period, a failed
   attempt held until every node of its answered a probe (then failed, or requeued if its
   collectives failed);
3. ask the policy (pure, `policy/policy.py`) what to admit and whom to preempt, and act on it through
   the lifecycle, which writes every change to the store first.
"""

from __future__ import annotations

import logging
import time

from core.jobs import JobState
from orchestrator.policy import autoscale
from orchestrator.policy.admission import free_capacity, place
from orchestrator.policy.hangs import start_stuck
from orchestrator.policy.node_watch import NodeWatch
from orchestrator.policy.policy import Policy
from orchestrator.policy.types import Allocation, Decision, JobRequest, Node
from orchestrator.ray.autoscaler import StandingRequest, node_types
from orchestrator.service.cluster_access import ClusterAccess
from orchestrator.service.lifecycle import Lifecycle
from orchestrator.service.store import JobRecord

log = logging.getLogger("orchestrator.service")


class SchedulingCycle:
    def __init__(self, lifecycle: Lifecycle, policy: Policy, config, cluster: ClusterAccess):
        self.lifecycle, self.policy, self.config, self.cluster = lifecycle, policy, config, cluster
        autoscaler = cluster.autoscaler
        # the node types an autoscaler may add (None: the cluster is what it is), what the
        # service asks it for, and the jobs it asked for (until they run)
        self.node_types = node_types(autoscaler) if autoscaler else None
        self.worker_cap = autoscaler.get("max_workers") if autoscaler else None
        self.scale_left: dict[str, int] = {}
        self.standing = StandingRequest()
        self.scaling_for: dict[str, str] = {}
        self.jobs = lifecycle.jobs
        self.nodes: list[Node] = []
        self.alive: set[str] = set()  # ids of the live nodes, from the last pass
        self.watch = NodeWatch(cluster.probe)  # which of them do not answer, or are in doubt
        self.draining: set[str] = set()  # live nodes being drained (about to go): no new work
        self.drained_away: set[str] = set()  # nodes that went after draining (Ray ends them once idle)
        self.node_events: list[dict] = []  # nodes that joined, were lost or began draining: newest 20
        self.nodes_lost = 0  # nodes that died (not drained) since the service started
        self.notes: dict[str, str] = {}  # why a pending job did not start, from the last pass
        self._kept: dict[str, tuple[tuple, JobRequest]] = {}  # the pending jobs' requests, last pass

    def run(self, now: float) -> None:
        self.refresh_nodes()
        self.reconcile(now)
        self.schedule(now)

    def refresh_nodes(self) -> None:
        nodes, head, raylets = [], None, {}
        for n in self.cluster.node_table():
            if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {}):
                head = n["NodeID"]
            if n.get("Alive"):
                capacity = {
                    k: float(v)
                    for k, v in n.get("Resources", {}).items()
                    if not k.startswith("node:") and isinstance(v, (int, float))
                }
                nodes.append(Node(n["NodeID"], capacity))
                raylets[n["NodeID"]] = (n["NodeManagerAddress"], int(n["NodeManagerPort"]))
        alive, draining = {n.id for n in nodes}, self.cluster.draining()
        for node in self.watch.update(raylets):
            why = self.watch.unreachable()[node]
            log.warning("node %s does not answer (%s): no job is placed there", node[:8], why)
            self.node_events.append({"time": time.time(), "event": "unreachable", "node": node})
        if self.alive:  # changes since the last pass, for `orchestrator queue` and the page
            now = time.time()
            gone = self.alive - alive
            changes = (
                ("joined", alive - self.alive),
                ("left", gone & self.draining),
                ("lost", gone - self.draining),
            )
            for event, ids in changes:
                self.node_events += [{"time": now, "event": event, "node": i} for i in sorted(ids)]
            self.nodes_lost += len(gone - self.draining)
            self.node_events += [
                {"time": now, "event": "draining", "node": i} for i in sorted(draining - self.draining)
            ]
            self.node_events = self.node_events[-20:]
        self.drained_away |= self.draining - alive
        self.nodes, self.alive, self.draining = nodes, alive, draining
        unusable = draining | self.watch.unusable()
        usable = [n for n in nodes if n.id not in unusable]
        if self.node_types is None:
            self.policy.set_nodes(usable)
            return
        workers = [n for n in nodes if n.id != head]
        self.scale_left = autoscale.headroom(self.node_types, workers, self.worker_cap)
        self.policy.set_nodes(
            usable, possible=autoscale.possible_nodes(usable, self.node_types, self.scale_left)
        )

    def lost_nodes(self, job: JobRecord) -> dict[str, str]:
        """{node: why} of the nodes of the job's placement that Ray no longer lists alive, or
        whose raylet does not answer."""
        if not self.alive:  # no node table read yet: judge nothing
            return {}
        unreachable = self.watch.unreachable()
        lost = {n: "declared dead by Ray" for n in job.placement if n not in self.alive}
        lost.update({n: f"does not answer ({unreachable[n]})" for n in job.placement if n in unreachable})
        return dict(sorted(lost.items()))

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        """Bring the job table in line with the attempt controllers Ray runs."""
        watched = self.jobs.holding()
        runner = self.lifecycle.runner
        statuses = runner.statuses() if any(j.submission_id for j in watched) else {}
        # a job's workers start after the previous job's did (`start_stuck`): the newest start
        # of a job that holds resources or ended (a waiting job's start is of an ended attempt)
        last_start = max((j.started_at or 0.0 for j in self.jobs.values()), default=0.0)
        deadline = self.config.start_deadline_s
        for job in watched:
            lost = self.lost_nodes(job) if job.state.holds_resources else {}
            if lost and job.state is JobState.STOPPING and set(lost) <= self.drained_away:
                lost = {}  # its workers stopped for the drain and Ray ended the idle node: the driver reports
            if lost and self._groups_survive(job, lost, now):
                continue
            if lost:  # its next admission starts a new attempt controller from the job's package
                self.lifecycle.node_lost(
                    job, list(lost), now, driver_gone=self._gone(job, statuses), why=lost
                )
                continue
            drained = sorted(set(job.placement) & self.draining)
            if drained and job.state is not JobState.STOPPING:  # checkpoint and move, before it goes
                self.lifecycle.request_stop(
                    job, "preempt", now, by=f"drain of {', '.join(n[:8] for n in drained)}"
                )
            if job.unconfirmed_failure:  # no node of its is known dead (yet)
                self._judge_failure(job, now)
                continue
            if self._gone(job, statuses):
                self.lifecycle.driver_gone(job, now, None)
            elif job.state is JobState.ADMITTED and start_stuck(job.admitted_at, last_start, now, deadline):
                self.lifecycle.start_timed_out(job, now)
            elif job.state is JobState.STOPPING:
                self.lifecycle.kill_after_grace(job, now)

    def _groups_survive(self, job: JobRecord, lost: dict[str, str], now: float) -> bool:
        """A running job of replica groups some of which the lost nodes leave untouched: those
        train on, and only the groups hit are lost."""
        if job.state is not JobState.RUNNING or not job.group_placements:
            return False
        hit = [g for g, nodes in enumerate(job.group_placements) if set(nodes) & set(lost)]
        live = [g for g, nodes in enumerate(job.group_placements) if nodes and g not in hit]
        if not live:
            return False
        self.lifecycle.group_lost(job, hit, lost, now)
        return True

    def replace_groups(self, holding: list[JobRecord], now: float) -> None:
        """A place for each lost replica group of a running job, before any waiting job is
        admitted: the job's reservation holds its whole size, so its groups come first."""
        for job in holding:
            if job.state is not JobState.RUNNING or {} not in job.group_placements:
                continue
            size = job.workers // len(job.group_placements)
            free = free_capacity(self.policy.nodes, [allocation(j) for j in holding])
            avoid = frozenset(job.avoid_nodes)
            ask = JobRequest(job.id, job.priority, size, job.per_worker, job.submitted_at, avoid_nodes=avoid)
            found = place(ask, free)
            if found:
                self.lifecycle.group_placed(job, job.group_placements.index({}), found, now)

    def _judge_failure(self, job: JobRecord, now: float) -> None:
        """A failed attempt held until every node of its answered a probe sent after the
        failure: then a failure in its collectives is the cluster's (requeued, within its own
        budget) and any other is the job's own (failed). If the probes settle nothing within
        the time Ray takes to declare a node dead (`node_loss_wait_s`), neither does waiting."""
        held = job.unconfirmed_failure
        answered = all(self.watch.cleared(node, held["at"]) for node in job.placement)
        if not answered and now - held["at"] <= self.config.node_loss_wait_s:
            return
        if held["summary"].get("infrastructure"):
            self.lifecycle.infrastructure_failure(job, now)
        else:
            self.lifecycle.confirm_failure(job, now)

    def _gone(self, job: JobRecord, statuses: dict[str, str]) -> bool:
        """Whether the attempt controller of a job that holds resources has ended (a job
        without one: a driver of an older client that runs the job itself, never judged)."""
        return bool(job.submission_id) and job.submission_id not in statuses

    # -- schedule ------------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        trials: dict[str, int] = {}  # running trials per sweep, for sweep.max_concurrent
        holding = self.jobs.holding()
        self.replace_groups(holding, now)
        for j in holding:
            if j.sweep:
                trials[j.sweep] = trials.get(j.sweep, 0) + 1

        def sweep_full(job: JobRecord) -> bool:
            return bool(job.sweep_max_concurrent) and trials.get(job.sweep, 0) >= job.sweep_max_concurrent

        ready = [j for j in self.jobs.pending() if j.not_before <= now and not sweep_full(j)]
        pending = self._requests(ready)
        running = [allocation(j) for j in holding]
        decision = self.policy.schedule(now, pending, running)
        self.notes = dict(decision.notes)
        for job_id, placement in decision.admit:
            job = self.jobs[job_id]
            if sweep_full(job):  # several trials of one sweep fit in this pass: start only its share
                continue
            if job.sweep:
                trials[job.sweep] = trials.get(job.sweep, 0) + 1
            self.lifecycle.admit(job, placement, now)
        for job_id in decision.preempt:
            # a move: the job starts again on other nodes, to give its node to the waiting job
            by = (
                f"{decision.reserved_for}, moving to other nodes"
                if decision.moving
                else decision.reserved_for
            )
            self.lifecycle.request_stop(self.jobs[job_id], "preempt", now, by=by)
        if self.node_types is not None:
            self.autoscale(decision, running, now)
        for job_id, size in decision.resize.items():  # checkpoint, then restart at the new size
            job = self.jobs[job_id]
            why = (
                f"shrink for {decision.reserved_for}" if size < job.placement_size else "grow into free room"
            )
            self.lifecycle.request_stop(
                job, "preempt", now, by=f"{why}: {job.placement_size} -> {size} workers", resize_to=size
            )

    def admission_order(self, now: float) -> list[str]:
        """The waiting jobs' ids in the order a pass at `now` admits them: the policy's own order
        (`Policy.order`) of the requests and allocations a pass hands it. Jobs held back for now
        (a start's backoff, a full sweep) are ordered with the rest."""
        pending = self._requests(self.jobs.pending())
        running = [allocation(j) for j in self.jobs.holding()]
        return [job.id for job in self.policy.order(now, pending, running)]

    def _requests(self, jobs: list[JobRecord]) -> list[JobRequest]:
        """The pending jobs as the policy sees them, each kept from the last pass while what it
        is built from stays the same (10,000 waiting jobs: building them all was half a pass)."""
        kept, self._kept = self._kept, {}
        out = []
        for job in jobs:
            key = (
                job.priority,
                job.workers,
                tuple(job.per_worker.items()),
                job.submitted_at,
                job.preemptible,
                job.queue,
                job.remaining_s,
                job.user,
                job.attained_s,
                job.pending_since,
                tuple(job.avoid_nodes),
            )
            found = kept.get(job.id)
            made = found[1] if found is not None and found[0] == key else request(job)
            self._kept[job.id] = (key, made)
            out.append(made)
        return out

    # -- autoscaling -------------------------------------------------------------------------

    def autoscale(self, decision: Decision, running: list[Allocation], now: float) -> None:
        """Ask the autoscaler for the nodes the head of the queue needs when it does not fit
        now (and no preemption makes room), and keep asking until the job runs: nodes that
        stand idle while its workers start would be taken away again."""
        head = self.jobs.get(decision.head) if decision.head else None
        if head is not None and head.state.is_pending and not (decision.preempt or decision.resize):
            smallest = request(head)
            smallest = smallest.at_size(smallest.allowed_sizes()[-1])
            admitted = [allocation(self.jobs[job_id]) for job_id, _ in decision.admit]
            free = free_capacity(self.policy.nodes, running + admitted)
            plan = (
                None
                if place(smallest, free)
                else autoscale.nodes_to_add(smallest, free, self.node_types, self.scale_left)
            )
            if plan and head.id not in self.scaling_for:
                self.scaling_for[head.id] = autoscale.describe(plan, self.node_types)
                head.log("autoscaler-requested", now, nodes=self.scaling_for[head.id])
                self.lifecycle.save(head)
        for job_id in list(self.scaling_for):
            job = self.jobs.get(job_id)
            if job is None or not (job.state.is_pending or job.state is JobState.ADMITTED):
                del self.scaling_for[job_id]  # running, or it will not run: withdrawn
            elif job.state.is_pending:
                self.notes[job_id] = f"waiting for the autoscaler: {self.scaling_for[job_id]}"
        bundles = []
        if self.scaling_for:  # what runs, plus what waits for nodes: Ray sizes the cluster to hold all
            for job in self.jobs.values():
                size = job.placement_size if job.state.holds_resources else 0
                if not size and job.id in self.scaling_for:
                    size = min(request(job).allowed_sizes())
                bundles += [dict(job.per_worker)] * size
        self.standing.set(bundles)


def request(job: JobRecord) -> JobRequest:
    """A pending job as the policy sees it."""
    return JobRequest(
        job.id,
        job.priority,
        job.workers,
        job.per_worker,
        job.submitted_at,
        job.preemptible,
        job.queue,
        job.remaining_s,
        sizes=elastic_sizes(job),
        user=job.user,
        attained_s=job.attained_s,
        queued_since=job.pending_since,
        avoid_nodes=frozenset(job.avoid_nodes),
    )


def allocation(job: JobRecord) -> Allocation:
    """A job that holds resources, as the policy sees it."""
    remaining = job.remaining_s
    return Allocation(
        job.id,
        job.priority,
        dict(job.placement),
        job.per_worker,
        job.admitted_at or 0.0,
        job.preemptible,
        job.queue,
        None if remaining is None else time.time() + remaining,
        stopping=job.state is JobState.STOPPING,
        sizes=elastic_sizes(job),
        user=job.user,
        attained_s=job.attained_s,
        avoid_nodes=frozenset(job.avoid_nodes),
        starting=job.state is JobState.ADMITTED,
        submitted_at=job.submitted_at,
    )


def elastic_sizes(job: JobRecord) -> tuple[int, ...]:
    """The sizes an elastic job may run at, largest first; () for a job of one size."""
    return job.spec.worker_sizes() if job.spec.resources.elastic else ()
