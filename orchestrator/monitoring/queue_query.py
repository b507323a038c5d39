"""One page of the queue, as `GET /api/queue?offset=&limit=&state=&q=&finished=` asks for it.

At 10,000 waiting jobs the whole list took 1.9 s to build and send, and a page could not show
it anyway. A `QueueQuery` says which jobs a reader wants (some states, words to search for,
finished jobs or not) and which slice of them in queue order; `select` picks them out of any
collection of jobs, so the service builds views of one page's jobs only, not of 11,000. The
shape is Kueue's visibility API for pending workloads (`?limit=&offset=`), with the totals a
reader needs to page (how many match, and how many of them are in each state).

Imports no Ray and nothing of the service: the status page's server parses the query, the
service (and any `PageSource`) answers it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from core.jobs import TERMINAL_VALUES, JobState

PAGE_PARAMS = ("offset", "limit", "state", "q")  # any of them: the reply is a page, not a list
DEFAULT_LIMIT = 50
MAX_LIMIT = 500  # a page a browser renders in one go
# the fields a search looks in, as a job's view names them (the service reads the same ones
# from its records: views.py's `_searched`)
SEARCHED = ("id", "name", "run", "queue", "user", "sweep", "state", "note", "reason")
STATE_NAMES = tuple(state.value for state in JobState)

Job = TypeVar("Job")


def is_paged(params: Mapping[str, str]) -> bool:
    """Whether a request asks for a page (a dict with totals) rather than the plain list that
    callers from before paging read."""
    return any(name in params for name in PAGE_PARAMS)


@dataclass(frozen=True)
class QueueQuery:
    offset: int = 0
    limit: int = DEFAULT_LIMIT
    states: frozenset[str] = frozenset()  # none: every state (finished ones only if `finished`)
    words: tuple[str, ...] = ()  # lower case; a job matches when each is in one of its SEARCHED
    finished: bool = True

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> QueueQuery:
        """The query of a request's parameters; ValueError with one line a person can act on."""
        offset = _count(params.get("offset", "0"), "offset", 0, None)
        limit = _count(params.get("limit", str(DEFAULT_LIMIT)), "limit", 1, MAX_LIMIT)
        states = frozenset(s.strip() for s in params.get("state", "").split(",") if s.strip())
        unknown = sorted(states - set(STATE_NAMES))
        if unknown:
            raise ValueError(f"unknown state '{unknown[0]}': one of {', '.join(STATE_NAMES)}")
        words = tuple(params.get("q", "").lower().split())
        finished = params.get("finished", "1").lower() not in ("0", "false", "no")
        return cls(offset, limit, states, words, finished)

    def shows(self, state: str) -> bool:
        """Whether jobs in `state` are listed: the states asked for, else every state but the
        finished ones when those are left out."""
        if self.states:
            return state in self.states
        return self.finished or state not in TERMINAL_VALUES

    def matches(self, texts: Iterable[str | None]) -> bool:
        """Whether every word of the search is in one of `texts` (a job's SEARCHED fields)."""
        if not self.words:
            return True
        haystack = " ".join(t for t in texts if t).lower()
        return all(word in haystack for word in self.words)

    def select(
        self,
        jobs: Iterable[Job],
        state_of: Callable[[Job], str],
        texts_of: Callable[[Job], Iterable[str | None]],
        order: Callable[[Job], tuple],
    ) -> Page:
        """This query's page of `jobs` in `order`, how many match it, and how many match the
        search in each state (the state filter aside: what a reader may filter on next)."""
        chosen: list[Job] = []
        counts: dict[str, int] = {}
        for job in jobs:
            if self.words and not self.matches(texts_of(job)):
                continue
            state = state_of(job)
            counts[state] = counts.get(state, 0) + 1
            if self.shows(state):
                chosen.append(job)
        # the first offset + limit without sorting them all: a first page of 50 out of 11,000
        first = heapq.nsmallest(self.offset + self.limit, chosen, key=order)
        return Page(first[self.offset :], len(chosen), counts)


@dataclass
class Page:
    jobs: list
    total: int  # the jobs that match the query, on every page
    counts: dict[str, int] = field(default_factory=dict)  # those matching the search, by state

    def reply(self, query: QueueQuery, views: list[dict]) -> dict:
        """The JSON of this page, with `views` of its jobs."""
        return {
            "jobs": views,
            "offset": query.offset,
            "limit": query.limit,
            "total": self.total,
            "counts": self.counts,
        }


def _count(text: str, name: str, low: int, high: int | None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        most = f" to {high}" if high is not None else " or more"
        raise ValueError(f"{name} must be a whole number, {low}{most}")
    return value
