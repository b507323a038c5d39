"""What to ask an autoscaler for when the head of the queue does not fit the cluster now.

Pure: node types and counts in, a plan out. The service (`service/cycle.py`) hands the plan to Ray's
autoscaler (`orchestrator/ray/autoscaler.py`) as bundles, and withdraws it once the job runs.

A node type is what an autoscaler config declares (Ray's `available_node_types`): the
resources of one node and how many such nodes it may run (`max_workers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.policy.admission import format_resources, place, positive
from orchestrator.policy.types import JobRequest, Node, Resources

HOST_RESOURCES = {"CPU", "memory", "object_store_memory"}  # every node has these: none is wasted


@dataclass(frozen=True)
class NodeType:
    name: str
    resources: Resources  # one node's
    max_nodes: int


def matches(node_type: NodeType, capacity: Mapping[str, float]) -> bool:
    """A live node is of this type when it offers exactly the type's resources."""
    return all(abs(capacity.get(name, 0.0) - amount) < 1e-6 for name, amount in node_type.resources.items())


def headroom(types: list[NodeType], workers: list[Node], total_cap: int | None = None) -> dict[str, int]:
    """Nodes of each type the autoscaler may still add, given the live worker nodes (not the
    head) and the config's cap on worker nodes in all (`max_workers` at its top level). Only
    nodes of its types count: a node someone started by hand is not the autoscaler's."""
    left, launched = {}, 0
    for node_type in types:
        running = sum(1 for node in workers if matches(node_type, node.capacity))
        left[node_type.name] = max(node_type.max_nodes - running, 0)
        launched += running
    if total_cap is not None:
        room = max(total_cap - launched, 0)
        left = {name: min(count, room) for name, count in left.items()}
    return left


def possible_nodes(nodes: list[Node], types: list[NodeType], left: Mapping[str, int]) -> list[Node]:
    """The live nodes plus every node the autoscaler may still add: the largest cluster."""
    extra = [
        Node(f"(autoscaler) {t.name} #{i + 1}", dict(t.resources))
        for t in types
        for i in range(left.get(t.name, 0))
    ]
    return [*nodes, *extra]


def nodes_to_add(
    job: JobRequest,
    free_by_node: Mapping[str, Mapping[str, float]],
    types: list[NodeType],
    left: Mapping[str, int],
) -> dict[str, int] | None:
    """The fewest new nodes (type name -> count) with which the job fits beside the free
    resources of the live nodes, adding each time a node of the type that holds the most of
    its workers, among the types that carry no accelerator the job leaves unused (a CPU job
    gets a GPU node only when no other will do); None when even every node the autoscaler
    may add is not enough."""
    need = positive(job.per_worker)
    free = {node_id: dict(resources) for node_id, resources in free_by_node.items()}
    left = dict(left)
    plan: dict[str, int] = {}
    useful = [t for t in types if all(t.resources.get(n, 0.0) >= a for n, a in need.items())]
    while place(job, free) is None:
        candidates = [t for t in useful if left.get(t.name, 0) > 0]
        if not candidates:
            return None
        best = max(
            candidates,
            key=lambda t: (
                not set(positive(t.resources)) - set(need) - HOST_RESOURCES,
                min(t.resources.get(n, 0.0) / a for n, a in need.items()),
                t.name,
            ),
        )
        left[best.name] -= 1
        plan[best.name] = plan.get(best.name, 0) + 1
        free[f"(new) {best.name} #{plan[best.name]}"] = dict(best.resources)
    return plan


def describe(plan: Mapping[str, int], types: list[NodeType]) -> str:
    """'2 more node(s) of slot-node (2 CPU, 1 slot)'."""
    by_name = {t.name: t for t in types}
    parts = [
        f"{count} more node(s) of {name} ({format_resources(by_name[name].resources)})"
        for name, count in plan.items()
    ]
    return ", ".join(parts)
