"""The queue configuration (`orchestrator queues apply`): the policy built from it, applied to
the running service and kept in the store, so that a restart applies it again. A mixin of
`OrchestratorService` (actor.py), which gives it `config`, `store`, `policy`, `cycle`, `door`,
`lock` and `_wake`; imports no Ray.

Applying goes through the door like every other change (`access.py`): an admin's call only,
its audit entry written first. A configuration sent over HTTP (`PUT /api/queues`) is checked
against the schema again here, since anyone holding a token may send one.
"""

from __future__ import annotations

import logging

from core.queues import QueueConfig, validate_queue_config
from core.spec import SpecError
from orchestrator.policy.permissions import Action
from orchestrator.policy.policy import Policy
from orchestrator.service.access import ACTOR, HTTP, Door

log = logging.getLogger("orchestrator.service")


class QueueCalls:
    door: Door

    def _policy(self, queues: QueueConfig | None) -> Policy:
        """The policy with `queues`; ValueError if a queue has both a --quota and an entry."""
        return Policy(
            [],
            quotas=self.config.quotas,
            backfill=self.config.backfill,
            preemption=self.config.preemption,
            grow_after_s=self.config.grow_after_s,
            move_after_s=self.config.move_after_s,
            queues=queues,
        )

    def _startup_policy(self) -> Policy:
        """With the queue configuration applied last (`queues apply`, or `up --queues`, which
        stores it before it starts the service), kept in the store: a restart applies it again."""
        stored = self.store.load_queues()
        if stored is None:
            return self._policy(None)
        try:  # written by `set_queues`: a load, but a newer schema or a new --quota may refuse it
            return self._policy(validate_queue_config(stored, "stored queues.json"))
        except (SpecError, ValueError) as err:
            log.error("the stored queue configuration is not applied: %s", str(err).splitlines()[0])
            return self._policy(None)

    def set_queues(self, queues: QueueConfig | None, token: str | None = None) -> dict | None:
        """Apply a queue configuration validated by the CLI (None: back to none) and store it
        for the next start. Refused (ValueError, nothing changed) when a queue has a --quota."""
        detail = {"queues": None if queues is None else sorted(queues.queues)}
        with self.lock, self.door.acting(token, ACTOR, Action.QUEUES_APPLY, **detail):
            self._apply_queues(queues)
        self._wake.set()
        return self.queues_view()

    def apply_queues(self, raw: dict | None, token: str | None = None, route: str = HTTP) -> dict | None:
        """A configuration as JSON (None: back to none), validated once the caller is known to
        be allowed: a bad one is a `failed` entry and a ValueError of its first problem."""
        names = sorted(raw.get("queues") or {}) if isinstance(raw, dict) else None
        with self.lock, self.door.acting(token, route, Action.QUEUES_APPLY, queues=names):
            try:
                queues = None if raw is None else validate_queue_config(raw, "queue configuration")
            except SpecError as err:
                raise ValueError(str(err).splitlines()[0]) from None
            self._apply_queues(queues)
        self._wake.set()
        return self.queues_view()

    def _apply_queues(self, queues: QueueConfig | None) -> None:
        policy = self._policy(queues)
        policy.set_nodes(self.policy.nodes, self.policy.possible)
        self.store.save_queues(None if queues is None else queues.model_dump(mode="json"))
        self.policy = self.cycle.policy = policy
        log.info(
            "queue configuration %s",
            "cleared" if queues is None else f"of {len(queues.queues)} queue(s) applied",
        )
