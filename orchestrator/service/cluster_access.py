"""What the service takes from the Ray cluster it runs on, in one place: who it is, the node
table, the nodes being drained, the raylets' probe, the Ray Jobs API, the cluster's health
checks, its autoscaler's config and its auth token.

The service is handed one `ClusterAccess` (`of_ray`, on a cluster); everything else in the
service is Python over its tables. A benchmark hands it a node table and a runner of its own
(bench/service_scale.py) and measures the service's own bookkeeping without a cluster.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from orchestrator.ray.node_health import HealthChecks


class Runner(Protocol):
    """Attempt controllers started, watched and stopped (`runner.AttemptRunner`)."""

    def launch(self, job_id: str, attempt: int, package_uri: str, placement: dict[str, int]) -> str: ...

    def stop(self, sid: str) -> None: ...

    def statuses(self) -> dict[str, str]: ...


@dataclass
class ClusterAccess:
    owner: str  # the service's name in the store's lease (its actor id)
    runner: Runner
    node_table: Callable[[], list[dict]]  # `ray.nodes()`: NodeID, Alive, Resources, raylet address
    draining: Callable[[], set[str]]  # ids of the nodes being drained
    probe: Callable[[str, int], str | None]  # a raylet's address and port -> None, or why it is not there
    health_checks: HealthChecks
    autoscaler: dict | None  # node types an autoscaler may add (None: the cluster is what it is)
    token: str | None  # the cluster's auth token: jobs sent over HTTP must carry it


def of_ray(dashboard: str, autoscaler: dict | None) -> ClusterAccess:
    """The Ray cluster this process is connected to (the service actor's); `autoscaler`: the
    config given to the service, else the one found beside the cluster's monitor."""
    import ray

    from orchestrator.ray import node_health
    from orchestrator.ray.autoscaler import detected_config
    from orchestrator.ray.cluster import read_token
    from orchestrator.service.runner import AttemptRunner

    context = ray.get_runtime_context()
    return ClusterAccess(
        owner=context.get_actor_id() or f"service-{secrets.token_hex(4)}",
        runner=AttemptRunner(dashboard),
        node_table=ray.nodes,
        draining=draining_nodes,
        probe=node_health.probe,
        health_checks=HealthChecks.of_cluster(context.gcs_address),
        autoscaler=autoscaler or detected_config(context.gcs_address),  # on the head, beside its monitor
        token=read_token(),
    )


def draining_nodes() -> set[str]:
    """Ids of the nodes Ray is draining (`ray drain-node`, or the autoscaler before it stops a
    node or the cloud preempts it). Ray Train reads the same table for its own preemption
    notices (ray.train.get_preemption_info); Ray offers no public call for it yet."""
    from orchestrator.ray import internals

    try:
        return internals.draining_nodes()
    except Exception:  # an older or a remote cluster without it: no node is draining
        return set()
