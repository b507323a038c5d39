"""The lighthouse of a job's replica groups (torchft's `LighthouseServer`): an actor beside the
attempt's controller, as Ray Train's own `TorchftConfig` runs one, so that the controller's
process never imports torch (torchft does). It lives as long as the controller that started it
(an actor it owns), on the controller's node: the head for a job of replica groups, which
outlives any one group's node.
"""

from __future__ import annotations

import ray

# a quorum waits this long for the groups of the last one before it forms without them: long
# enough for the groups of a start to find each other, short beside a lost group's steps
JOIN_TIMEOUT_MS = 5000


@ray.remote(num_cpus=0, max_restarts=0)
class Lighthouse:
    def __init__(self, join_timeout_ms: int = JOIN_TIMEOUT_MS):
        from torchft.coordination import LighthouseServer

        # a quorum of one group is a quorum: the job trains on through the loss of the others
        self.server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=join_timeout_ms)

    def address(self) -> str:
        """Its address by this node's IP (the server names its host, which other nodes may not resolve)."""
        port = self.server.address().rsplit(":", 1)[1]
        host = ray.util.get_node_ip_address()
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def start(node_id: str) -> tuple[object, str]:
    """A lighthouse on `node_id`; its handle (keep it: the actor lives while it is held) and address."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id, soft=False)
    actor = Lighthouse.options(scheduling_strategy=here).remote()
    return actor, ray.get(actor.address.remote(), timeout=120)
