"""The service's job table: every job by id, and the jobs of each state kept apart.

With 10,000 jobs waiting and 1,000 running, a scheduling pass, the watchdog, the exporter and
the views ask for "the jobs that hold resources" or "the waiting jobs" many times a second;
walking all 11,000 records for each question made a pass take a second (docs/scaling.md). The
table keeps, beside the dict by id, one dict per state, in submission order. A job's state
changes in one place only (`Lifecycle.set_state`), which tells the table (`moved`); a job
enters by `table[id] = job`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from core.jobs import JobState
from orchestrator.service.store import JobRecord

HOLDING = tuple(s for s in JobState if s.holds_resources)
PENDING = tuple(s for s in JobState if s.is_pending)
TERMINAL = tuple(s for s in JobState if s.is_terminal)


class JobTable(dict[str, JobRecord]):
    """A dict of the jobs by id (what it always was), with `in_states` for the jobs of some
    states without a walk over the others."""

    def __init__(self, jobs: dict[str, JobRecord] | None = None):
        super().__init__()
        self._by_state: dict[JobState, dict[str, JobRecord]] = {s: {} for s in JobState}
        self._filed: dict[str, JobState] = {}  # the state each job is filed under
        for job_id, job in (jobs or {}).items():
            self[job_id] = job

    def __setitem__(self, job_id: str, job: JobRecord) -> None:
        self._unfile(job_id)
        super().__setitem__(job_id, job)
        self._by_state[job.state][job_id] = job
        self._filed[job_id] = job.state

    def __delitem__(self, job_id: str) -> None:
        super().__delitem__(job_id)
        self._unfile(job_id)

    def pop(self, job_id: str, *default):
        self._unfile(job_id)
        return super().pop(job_id, *default)

    def _unfile(self, job_id: str) -> None:
        filed = self._filed.pop(job_id, None)
        if filed is not None:
            self._by_state[filed].pop(job_id, None)

    def moved(self, job: JobRecord) -> None:
        """`job`'s state changed (`Lifecycle.set_state`): file it under its new one."""
        if self.get(job.id) is job and self._filed.get(job.id) is not job.state:
            self[job.id] = job

    def in_states(self, states: Iterable[JobState]) -> Iterator[JobRecord]:
        """The jobs in `states`, each state's in the order they entered it."""
        for state in states:
            yield from list(self._by_state[state].values())

    def holding(self) -> list[JobRecord]:
        """The jobs that hold resources: admitted, running, stopping."""
        return list(self.in_states(HOLDING))

    def pending(self) -> list[JobRecord]:
        """The jobs waiting in the queue: queued or preempted."""
        return list(self.in_states(PENDING))

    def alive(self) -> list[JobRecord]:
        """Every job not finished."""
        return list(self.in_states(s for s in JobState if not s.is_terminal))

    def count(self, state: JobState) -> int:
        return len(self._by_state[state])


def table_of(jobs: dict[str, JobRecord]) -> JobTable:
    """`jobs` as a table (itself if it is one already)."""
    return jobs if isinstance(jobs, JobTable) else JobTable(jobs)
