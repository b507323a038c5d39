"""The service's calls about people (`users add|list|revoke`, `audit`, the scrape token `up`
makes) and what its other calls are decided on: the queue a job goes to (which teams it
takes) and the owner of a job. A mixin of `OrchestratorService` (actor.py), which gives it
`door`, `lock`, `jobs` and `policy`; imports no Ray.

Each user call takes the caller's token first (None: the Ray token's holder, the cluster's
admin) and goes through the door like every other call (`access.py`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.policy.permissions import Action, JobTarget, QueueTarget, Role
from orchestrator.service.access import ACTOR, Door
from orchestrator.service.audit import AuditLog
from orchestrator.service.tenants import Tenants, UserError, is_loopback, job_owner, local_admin

SCRAPER = "prometheus"  # the viewer whose token `orchestrator up` writes for Prometheus
SCRAPER_TEAM = "monitoring"


def open_door(config, cluster_token: str | None) -> Door:
    """The door of a service with `config` (a ServiceConfig): its registry and audit log in
    the store, and the local admin for a call without a token while the page is on loopback."""
    default = local_admin() if config.single_user and is_loopback(config.web_host) else None
    return Door(Tenants.open(config.store, default), AuditLog.open(config.store), cluster_token)


def queue_target(queue_config, queue: str) -> QueueTarget:
    """The queue a job is submitted to, with the teams the applied configuration lets use it."""
    return QueueTarget(queue, None if queue_config is None else queue_config.teams_of(queue))


class TenantCalls:
    door: Door

    # -- what calls are decided on ---------------------------------------------------------

    def queue_target(self, queue: str) -> QueueTarget:
        return queue_target(self.policy.queue_config, queue)

    def job_target(self, job_id: str) -> JobTarget:
        """The job's owner (KeyError: no such job; `_job` says so in the service's words)."""
        job = self._job(job_id)
        return job_owner(job.id, job.user, job.team)

    # -- users -------------------------------------------------------------------------------

    def add_user(
        self, token: str | None, name: str, team: str, role: str, route: str = ACTOR
    ) -> dict[str, Any]:
        """A new user and its token, which exists in the clear only in this reply."""
        detail = {"user": name, "team": team, "role": role}
        with self.lock, self.door.acting(token, route, Action.USERS_MANAGE, verb="add", **detail) as me:
            new = self.door.tenants.add(name, team, role, by=me.user)
        return {**detail, "token": new}

    def list_users(self, token: str | None, route: str = ACTOR) -> list[dict[str, Any]]:
        self.door.check_read(token, route, Action.USERS_MANAGE)
        with self.lock:
            return self.door.tenants.list_users()

    def revoke_user(self, token: str | None, name: str, route: str = ACTOR) -> dict[str, Any]:
        """The user's token stops working now, for every route."""
        with self.lock, self.door.acting(token, route, Action.USERS_MANAGE, verb="revoke", user=name) as me:
            return self.door.tenants.revoke(name, by=me.user).view()

    def scrape_token(self, token: str | None = None) -> str:
        """A new token for the viewer Prometheus scrapes `/metrics` with (`orchestrator up`
        writes it into the config it prints); the one before stops working."""
        detail = {"user": SCRAPER, "team": SCRAPER_TEAM, "role": str(Role.VIEWER)}
        with self.lock, self.door.acting(token, ACTOR, Action.USERS_MANAGE, verb="rotate", **detail) as me:
            tenants = self.door.tenants
            try:
                tenants.revoke(SCRAPER, by=me.user)
            except UserError:  # the first `up`: no scraper yet
                pass
            return tenants.add(SCRAPER, SCRAPER_TEAM, Role.VIEWER, by=me.user)

    # -- the audit log -----------------------------------------------------------------------

    def audit(
        self,
        token: str | None,
        since: float | None,
        until: float | None = None,
        user: str | None = None,
        route: str = ACTOR,
    ) -> list[dict[str, Any]]:
        """Entries between since and until (either open), of `user` if given, oldest first."""
        return self.door.read_audit(token, route, since, until, user)
