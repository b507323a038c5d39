"""Helpers of the scheduling policy's tests (tests/test_scheduler_*.py): a pending job, a
running job and nodes in a line each; hypothesis strategies for clusters, running jobs and
pending jobs; elastic jobs.

Resource names are arbitrary: "accel" stands in for GPUs, as a custom Ray resource would.
"""

from __future__ import annotations

from hypothesis import strategies as st

from core.queues import validate_queue_config
from orchestrator.policy import Allocation, Decision, JobRequest, Node, place
from orchestrator.policy.elastic import requeued

EPS = 1e-6
# strict FIFO within a priority level, for the tests about it (every queue's default is las-share)
FIFO = validate_queue_config({"order": "fifo"})


def job(
    job_id: str,
    workers: int = 1,
    accel: float = 1,
    priority: int = 0,
    submitted_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    est: float | None = None,
    cpu: float = 0,
) -> JobRequest:
    per_worker = {"accel": accel, **({"cpu": cpu} if cpu else {})}
    return JobRequest(job_id, priority, workers, per_worker, submitted_at, preemptible, queue, est)


def running(
    job_id: str,
    placement: dict[str, int],
    accel: float = 1,
    priority: int = 0,
    started_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    est_end: float | None = None,
    stopping: bool = False,
) -> Allocation:
    return Allocation(
        job_id, priority, placement, {"accel": accel}, started_at, preemptible, queue, est_end, stopping
    )


def nodes_of(*accels: float, cpu: float = 64) -> list[Node]:
    return [Node(f"n{i}", {"accel": a, "cpu": cpu}) for i, a in enumerate(accels)]


def admitted(decision: Decision) -> list[str]:
    return [job_id for job_id, _ in decision.admit]


# -- hypothesis strategies ------------------------------------------------------------------------

ACCEL = "accel"


@st.composite
def clusters(draw):
    count = draw(st.integers(1, 3))
    return [
        Node(f"n{i}", {ACCEL: float(draw(st.integers(1, 4))), "cpu": float(draw(st.integers(2, 6)))})
        for i in range(count)
    ]


@st.composite
def allocations_on(draw, nodes, max_jobs=6, elastic=False):
    """Running jobs that fit the nodes together (with `elastic`, some at one of their sizes)."""
    free = {node.id: dict(node.capacity) for node in nodes}
    out = []
    for index in range(draw(st.integers(0, max_jobs))):
        request = draw(requests(f"r{index}", elastic=elastic))
        placement = place(request.at_size(draw(st.sampled_from(request.allowed_sizes()))), free)
        if placement is None:
            continue
        for node_id, count in placement.items():
            for name, amount in request.per_worker.items():
                free[node_id][name] -= amount * count
        out.append(
            Allocation(
                request.id,
                request.priority,
                placement,
                request.per_worker,
                float(draw(st.integers(0, 20))),
                request.preemptible,
                request.queue,
                draw(st.none() | st.floats(0, 50)),
                draw(st.booleans()) and draw(st.booleans()),  # a quarter are stopping
                sizes=request.sizes,
            )
        )
    return out


@st.composite
def requests(draw, job_id, submitted_at=0.0, elastic=False):
    """A pending job; with `elastic`, half of them elastic (2 to 4 sizes out of 1..6 workers)."""
    per_worker = {
        ACCEL: draw(st.sampled_from([0.0, 1.0, 1.0, 2.0])),
        "cpu": draw(st.sampled_from([0.5, 1.0, 2.0])),
    }
    sizes: tuple[int, ...] = ()
    if elastic and draw(st.booleans()):
        sizes = tuple(sorted(draw(st.sets(st.integers(1, 6), min_size=2, max_size=4)), reverse=True))
    return JobRequest(
        job_id,
        draw(st.integers(0, 2)),
        sizes[0] if sizes else draw(st.integers(1, 3)),
        per_worker,
        submitted_at,
        draw(st.booleans()),
        draw(st.sampled_from(["default", "research"])),
        None,
        sizes=sizes,
    )


# -- elastic jobs ---------------------------------------------------------------------------------


def elastic(job_id: str, sizes: tuple[int, ...], **kwargs) -> JobRequest:
    """A pending elastic job (the keywords of `job`)."""
    request = job(job_id, workers=sizes[0], **kwargs)
    return JobRequest(**{**request.__dict__, "sizes": sizes})


def holding(
    job_id: str,
    placement: dict[str, int],
    sizes: tuple[int, ...] = (),
    priority: int = 0,
    started_at: float = 0.0,
    preemptible: bool = False,
    queue: str = "default",
    stopping: bool = False,
    accel: float = 1,
) -> Allocation:
    """A running job, elastic when it has sizes."""
    return Allocation(
        job_id,
        priority,
        placement,
        {"accel": accel},
        started_at,
        preemptible,
        queue,
        None,
        stopping,
        sizes,
    )


def sizes_of(decision) -> dict[str, int]:
    return {job_id: sum(placement.values()) for job_id, placement in decision.admit}


def comes_back(allocation: Allocation) -> JobRequest:
    """A resized job back in the queue, as the service requeues it. Its place in the queue is
    its submission time; the policy cannot see that for a running job and takes its start
    time instead, so the tests requeue it with that time."""
    return requeued(allocation)
