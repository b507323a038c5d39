"""Where an attempt of a job runs and what is checked before it starts, without Ray Train.

    driver_node       the node the attempt's controller runs on (most of the job's workers)
    label_selectors   one `ray.io/node-id` selector per worker, from the service's placement
    group_placements  a placement split into a job's replica groups, one node set each
    preflight         storage writable, the checkpoint to resume there, the data where it runs
    head_node_id      the cluster's head (CPU ranks there train in the background)
    describe_failure  a failed run's error as the summary needs it

The service and the CLI import this module; Ray Train's run itself (the trainer, the
workers' process group) is in `train_run.py`, which only an attempt's controller loads.
"""

from __future__ import annotations

import ray

from core import storage
from core.spec import JobSpec

NODE_ID_LABEL = "ray.io/node-id"  # Ray's built-in label: every node carries its own id


def group_placements(placement: dict[str, int], groups: int) -> list[dict[str, int]]:
    """{node: workers} split into `groups` equal groups, in the order of `label_selectors`
    (by node id): a node that holds workers of two groups takes both with it when it dies."""
    labels = [node for node, count in sorted(placement.items()) for _ in range(count)]
    size = len(labels) // groups
    split = []
    for group in range(groups):
        nodes: dict[str, int] = {}
        for node in labels[group * size : (group + 1) * size]:
            nodes[node] = nodes.get(node, 0) + 1
        split.append(nodes)
    return split


def union(placements: list[dict[str, int]]) -> dict[str, int]:
    """The job's placement: its groups' together."""
    nodes: dict[str, int] = {}
    for placement in placements:
        for node, count in placement.items():
            nodes[node] = nodes.get(node, 0) + count
    return dict(sorted(nodes.items()))


def driver_node(placement: dict[str, int]) -> str | None:
    """The node a job's control runs on (its attempt's controller, and Ray Train's controller
    loop in it): the one with the most of its workers (rank 0's on a tie)."""
    if not placement:
        return None
    return max(sorted(placement), key=lambda node: placement[node])


def label_selectors(placement: dict[str, int]) -> list[dict[str, str]]:
    """One selector per worker from {node id: workers on it}."""
    return [{NODE_ID_LABEL: node} for node, count in sorted(placement.items()) for _ in range(count)]


def preflight(spec: JobSpec, run_uri: str) -> None:
    """OSError, before any worker starts, when storage is unusable (the message names the URI)
    or the data is not where the job runs."""
    storage.check_writable(run_uri)
    resume = spec.checkpoint.resume
    if resume not in ("auto", "never"):
        try:
            found = storage.exists(resume)
        except Exception as err:
            raise OSError(f"checkpoint.resume: cannot read '{resume}': {err}") from None
        if not found:
            raise OSError(f"checkpoint.resume: no checkpoint at '{resume}'")
    from workers.checks import data_problems  # the data plane's registries

    problems = data_problems(spec)
    if problems:
        raise OSError(problems[0])


def head_node_id() -> str | None:
    """The cluster's head node (Ray gives only the head `node:__internal_head__`): CPU ranks
    there train in the background (workers/cpu_priority.py)."""
    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def describe_failure(err: BaseException) -> dict:
    """What the summary needs of a failed `fit()`, as plain data: the ranks that died, the
    error's first lines, and whether Ray gave up on a worker group (out of restarts)."""
    failures = getattr(err, "worker_failures", None) or {}  # WorkerGroupError: rank -> error
    # a dead worker shows up as a failed health check wrapping the actor's death
    died = [
        rank
        for rank, e in sorted(failures.items())
        if isinstance(getattr(e, "health_check_failure", e), ray.exceptions.RayActorError)
    ]
    lines = [line for line in str(err).splitlines() if line.strip()]
    return {
        "died": died,
        "text": " ".join(lines[:2]) if lines else type(err).__name__,
        "group": bool(failures),
    }
