"""An orchestrator service without Ray, for the tenants' unit tests: the real service class
(actor.py) over a store folder, with a cluster of no nodes (jobs stay queued; nothing starts)
and a runner that starts nothing. Its calls are made as the actor's would be, directly.

    two teams: ann (vision, member), bob (nlp, member), vic (viewer), ada (admin);
    queues: vision-gpu (team vision), nlp-gpu (team nlp), shared (every team)
"""

from __future__ import annotations

from core.queues import validate_queue_config
from core.spec import load_spec
from orchestrator.ray.node_health import HealthChecks
from orchestrator.service.actor import OrchestratorService
from orchestrator.service.cluster_access import ClusterAccess

RAY_TOKEN = "the-ray-clusters-own-token"
QUEUES = {
    "queues": {
        "vision-gpu": {"teams": ["vision"]},
        "nlp-gpu": {"teams": ["nlp"]},
        "shared": {},
    }
}


class IdleRunner:
    def launch(self, *args, **kwargs) -> str:
        raise AssertionError("a cluster of no nodes admits nothing")

    def stop(self, sid: str) -> None:
        pass

    def statuses(self, ray_jobs: bool = False) -> dict[str, str]:
        return {}


def no_nodes_cluster() -> ClusterAccess:
    return ClusterAccess(
        owner="unit-test",
        runner=IdleRunner(),
        node_table=lambda: [],
        draining=set,
        probe=lambda address, port: None,
        health_checks=HealthChecks(),
        autoscaler=None,
        token=RAY_TOKEN,
    )


def start_service(store: str, **config) -> OrchestratorService:
    service = OrchestratorService(
        {"store": store, "dashboard": "http://127.0.0.1:1", "web_port": 0, "tick_s": 0.2, **config},
        no_nodes_cluster(),
    )
    service.set_queues(validate_queue_config(QUEUES))  # as the Ray token's holder
    return service


def add_team_users(service: OrchestratorService) -> dict[str, str]:
    """Each user's token, added by the Ray token's holder (no token)."""
    users = {"ann": ("vision", "member"), "bob": ("nlp", "member"), "vic": ("nlp", "viewer")}
    users["ada"] = ("ops", "admin")
    return {name: service.add_user(None, name, team, role)["token"] for name, (team, role) in users.items()}


def spec(queue: str = "shared", name: str = "tiny"):
    return load_spec("jobs/convnet.yaml", [f"scheduling.queue={queue}", f"name={name}", "train.steps=10"])
