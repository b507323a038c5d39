"""The Ray Train runs of one attempt, each `fit()` on a thread of the attempt's process.

A job of one group has one run, which Ray Train restarts after a failure. A job of replica
groups (`fault_tolerance.replica_groups`) has one run per group, each of the group's share of
the job's workers, placed where the service counted that group (`launcher.group_placements`),
and a lighthouse beside the attempt for their quorum (`orchestrator/ray/lighthouse.py`). Ray
Train never restarts a group's run: a group whose run fails is lost while the others train
on, and the attempt starts a replacement on the nodes the service places it on
(`follow`); the new group heals from a live peer (workers/replicas.py). A group the service
judged lost while its run goes on (a node whose raylet stopped answering while its workers
still train) is dismissed: its workers are told to leave at their next step (the attempt's
`stop_requested`), and its replacement starts without waiting for them.

    start     every run of the attempt
    alive     whether any run is still going (the attempt ends when none is)
    follow    the service's placement of each group: a group placed elsewhere (or nowhere) is
              dismissed; a lost group whose new place is known starts again there
    replace_lost  without a service: a lost group starts again wherever Ray finds room
    failure   how the attempt's runs failed, if no run ended well
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray

from core.spec import JobSpec
from orchestrator.attempt.states import GroupChanged
from orchestrator.ray import launcher


@dataclass
class GroupRun:
    group: int
    placement: dict[str, int] | None
    thread: threading.Thread | None = None
    failure: dict | None = None  # how its `fit()` failed (`launcher.describe_failure`)
    ended: bool = False
    dismissed: str | None = None  # why the service no longer counts it (its workers leave)


class Runs:
    def __init__(self, spec: JobSpec, run: str, controller, tell: Callable[[object], None]):
        """`controller`: the handle the workers call; `tell`: the attempt's inbox, for the groups'
        changes."""
        self.spec, self.run, self.controller, self.tell = spec, run, controller, tell
        self.groups = spec.fault_tolerance.replica_groups
        self.current: dict[int, GroupRun] = {}
        self.ended: list[GroupRun] = []
        self.lighthouse = None  # held: the actor lives while its handle does
        self.address: str | None = None
        self._ending = threading.Lock()  # a run's end and its dismissal, each seeing the other

    def start(self, placement: dict[str, int] | None) -> None:
        if self.groups == 1:
            self._start(0, placement)
            return
        from orchestrator.ray import lighthouse

        here = ray.get_runtime_context().get_node_id()
        self.lighthouse, self.address = lighthouse.start(here)
        parts = launcher.group_placements(placement, self.groups) if placement else [None] * self.groups
        for group, part in enumerate(parts):
            self._start(group, part)

    def _start(self, group: int, placement: dict[str, int] | None) -> None:
        replica = {"group": group, "lighthouse": self.address} if self.groups > 1 else None
        entry = GroupRun(group, placement)

        def fit() -> None:
            try:
                import_train_run().trainer(self.spec, self.run, self.controller, placement, replica).fit()
            except BaseException as err:  # reported in the summary, with the workers' own reason
                entry.failure = launcher.describe_failure(err)
            finally:
                with self._ending:
                    if entry.dismissed and entry.failure is None:  # its workers left when told to
                        entry.failure = {"died": [], "text": entry.dismissed, "group": True}
                    entry.ended = True
                    dismissed = entry.dismissed
                if replica is not None and not dismissed:
                    fields = {"state": "lost", "lost_at": time.time(), "reason": entry.failure["text"][:200]}
                    self.tell(GroupChanged(group, fields if entry.failure else {"state": "ended"}))

        entry.thread = threading.Thread(target=fit, name=f"fit-{group}", daemon=True)
        if replica is not None:
            nodes = sorted(placement or {})
            self.tell(GroupChanged(group, {"state": "starting", "started_at": time.time(), "nodes": nodes}))
        old = self.current.get(group)
        if old is not None:
            self.ended.append(old)
        self.current[group] = entry
        entry.thread.start()

    def alive(self) -> bool:
        return any(not run.ended for run in self.current.values())

    def join(self, timeout: float) -> None:
        """Wait at most `timeout` for a run to end."""
        going = [run for run in self.current.values() if not run.ended]
        if going:
            going[0].thread.join(timeout)

    def follow(self, placements: list[dict[str, int]] | None) -> list[int]:
        """The service's placement of each group: a group it placed elsewhere or nowhere (lost)
        is dismissed, whether or not Ray Train has seen its run fail (a node Ray declared dead
        may still run its workers: a raylet that froze); a replacement starts for each lost
        group the service has placed again. Returns the groups dismissed now."""
        if self.groups == 1 or not placements or not self.alive():
            return []
        dismissed = []
        for group, placement in enumerate(placements):
            run = self.current.get(group)
            if run is None or placement == run.placement:
                continue
            if run.dismissed is None:
                dismissed.append(group)
                with self._ending:  # told lost once: here, or by its `fit()` as it failed
                    run.dismissed = "the service judged its node(s) lost"
                    told = run.ended and run.failure
                if not told:
                    lost = {"state": "lost", "lost_at": time.time(), "reason": run.dismissed}
                    self.tell(GroupChanged(group, lost))
            if placement:
                self._start(group, placement)
        return dismissed

    def replace_lost(self) -> None:
        """Without a service (`orchestrator run`): a lost group starts again at once, where Ray
        finds room for it (its run waits until there is some), while another group trains."""
        if self.groups == 1 or not self.alive():
            return
        for group, run in list(self.current.items()):
            if run.ended and run.failure and run.placement is None:
                self._start(group, None)

    def failure(self) -> dict | None:
        """The attempt's failure: none if a run ended well (a lost group's does not fail the
        job while another trained to the end), else the last run's."""
        runs = [*self.ended, *self.current.values()]
        if any(run.ended and run.failure is None for run in runs):
            return None
        return next((run.failure for run in reversed(runs) if run.failure), None)


def import_train_run():
    """Ray Train's side of a run (`orchestrator/ray/train_run.py`), imported once."""
    from orchestrator.ray import internals, train_run

    internals.lean_trainer()
    return train_run
