"""The queue configuration: queues, their cohorts, nominal quotas, borrowing limits and order.

One YAML file (`orchestrator queues apply FILE`, or the file `orchestrator up` reads) holds it:

    cohorts: [research]
    queues:
      team-a: {cohort: research, nominal: {GPU: 8}, borrowing_limit: {GPU: 8}, order: las}
      team-b: {cohort: research, nominal: {GPU: 8}, order: las}
      batch:  {nominal: {GPU: 4}, teams: [vision, nlp]}   # no cohort: a hard cap, as `up --quota`
    las: {thresholds_gpu_s: [3600, 36000], starve_after_s: 14400, starve_factor: 4, min_run_s: 600,
          preempt_after_s: 0}

It is validated once, here, like a job spec (unknown keys, bad numbers and unknown cohorts
are one 'dotted.path: reason' line each, `SpecError`), and then passed on as the typed
`QueueConfig`: the scheduling policy reads this object and never a dict. What the fields
mean for scheduling is in docs/scheduler.md ("Queues, LAS and fair share"). No torch, no Ray.

`teams` says which teams' members may submit to a queue (`orchestrator/policy/permissions.py`);
a queue without it, or one the file does not list, takes every team (so files from before
teams keep working), and admins submit anywhere.

A queue's `order` is `las-share` (the default), `las` or `fifo`. `las-share` is LAS tuned by
issue 34: its own `las:` defaults, `LAS_SHARE_DEFAULTS`, filled in here where the file leaves
them out, and `policy.las.LAS_SHARE_TUNING`. The file's own `order` is that of every queue it
does not list and of each listed queue that names none; left out, it is `las-share`, or `las`
in a file whose queues name `las` (one `las:` block serves every LAS queue, so one file does
not mix `las` and `las-share`). Validation writes the orders it implies into the config, so the
stored copy says what runs; with no file at all, every queue is `las-share` (`DEFAULT_QUEUES`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from core.queue_orders import DEFAULT_ORDER, LAS_ORDERS
from core.spec.errors import SpecError, format_errors, short, value_kind
from core.spec.schema import NAME_PATTERN, Section
from core.spec.yaml_reader import read_yaml

Amount = Annotated[float, Field(ge=0)]
MAX_QUEUES = 1000
MAX_TEAMS = 1000  # of one queue
DEFAULT_THRESHOLDS_GPU_S = (3600.0, 36000.0)  # 1 and 10 GPU-hours: three LAS levels
# order `las-share`'s `las:` values where the file leaves them out (issue 34: four levels,
# promotion at 16x the run so far; docs/scheduler.md). Its tuning is `policy.las.LAS_SHARE_TUNING`.
# Issue 51: a head waits an hour before it stops anyone (the load sweep of docs/scheduler.md).
LAS_SHARE_DEFAULTS = {
    "thresholds_gpu_s": (3600.0, 36000.0, 360000.0),
    "starve_factor": 16.0,
    "preempt_after_s": 3600.0,
}
Order = Literal["fifo", "las", "las-share"]  # core.queue_orders.ORDERS


class LasSettings(Section):
    """Discretized least attained service (Tiresias): levels by attained GPU-seconds."""

    thresholds_gpu_s: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: list(DEFAULT_THRESHOLDS_GPU_S), max_length=16
    )
    starve_after_s: float = Field(4 * 3600.0, gt=0, description="a job waiting this long goes to level 0")
    starve_factor: float = Field(
        4.0, ge=0, description="... and at least this many times its run time so far"
    )
    min_run_s: float = Field(600.0, ge=0, description="least run time of an attempt before LAS preempts it")
    preempt_after_s: float = Field(
        0.0, ge=0, description="least wait of a job (since it became pending) before LAS preempts for it"
    )


class QueueSettings(Section):
    cohort: str | None = None
    nominal: dict[str, Amount] = Field(default_factory=dict)
    borrowing_limit: dict[str, Amount] | None = None  # None: up to the whole cohort's unused quota
    order: Order | None = None  # None: the file's `order` (filled in at validation)
    teams: list[str] | None = Field(None, max_length=MAX_TEAMS)  # None: every team may submit


class QueueConfig(Section):
    cohorts: list[str] = Field(default_factory=list)
    queues: dict[str, QueueSettings] = Field(default_factory=dict)
    order: Order | None = Field(
        None, description="of the queues not listed and of those that name none (None: filled in)"
    )
    las: LasSettings = Field(default_factory=LasSettings)

    @classmethod
    def from_quotas(cls, quotas: dict[str, dict[str, float]] | None) -> QueueConfig:
        """`orchestrator up --quota q=GPU:4` flags as a config: hard caps, no cohort, the default order."""
        return validate_queue_config({"queues": {q: {"nominal": dict(v)} for q, v in (quotas or {}).items()}})

    def teams_of(self, queue: str) -> frozenset[str] | None:
        """The teams whose members may submit to `queue`; None: every team (the queue has no
        `teams`, or the file does not list it)."""
        settings = self.queues.get(queue)
        if settings is None or settings.teams is None:
            return None
        return frozenset(settings.teams)

    def order_of(self, queue: str) -> str:
        """The order of any queue, listed or not (on a validated config: always set)."""
        settings = self.queues.get(queue)
        return settings.order if settings is not None and settings.order else self.order

    def las_queues(self) -> QueueNames:
        """The queues that LAS orders: listed ones with a LAS order and, when the file's order is
        one, every queue it does not list (a queue's name is whatever its jobs say)."""
        las = frozenset(name for name in self.queues if self.order_of(name) in LAS_ORDERS)
        if self.order in LAS_ORDERS:
            return QueueNames(frozenset(self.queues) - las, all_but=True)
        return QueueNames(las)

    def las_share(self) -> bool:
        """Whether the LAS queues are `las-share` ones (validation keeps a file to one LAS order)."""
        orders = [self.order, *(queue.order for queue in self.queues.values())]
        return "las-share" in orders

    def hard_caps(self) -> dict[str, dict[str, float]]:
        """Nominal quotas of the queues in no cohort: caps that nothing borrows or lends."""
        return {name: dict(q.nominal) for name, q in self.queues.items() if q.cohort is None and q.nominal}


@dataclass(frozen=True)
class QueueNames:
    """A set of queue names that may be every name but some (`all_but`): `name in names`."""

    names: frozenset[str]
    all_but: bool = False

    def __contains__(self, queue: object) -> bool:
        return (queue in self.names) != self.all_but

    def __bool__(self) -> bool:  # whether any name is in it
        return self.all_but or bool(self.names)


def validate_queue_config(raw: Any, source: str = "queue config") -> QueueConfig:
    """The typed config, or SpecError with one line per problem (nothing is half-applied)."""
    if not isinstance(raw, dict):
        raise SpecError([f"expected a mapping with 'queues', got {value_kind(raw)}"], source)
    try:
        config = QueueConfig.model_validate(raw)
    except ValidationError as err:
        raise SpecError(format_errors(err, raw, root=QueueConfig), source) from None
    problems = _order_problems(config)  # on the orders as written: what fills in cannot clash
    config = _with_order_defaults(config)
    problems += _reference_problems(config)
    if problems:
        raise SpecError(problems, source)
    return config


def load_queue_config(path: str | Path) -> QueueConfig:
    """Read and validate a queue config file (bounded YAML reading, as for job specs)."""
    return validate_queue_config(read_yaml(path), str(path))


def _with_order_defaults(config: QueueConfig) -> QueueConfig:
    """Every order the file implies, and `las-share`'s `las:` values where it does not set them,
    written into the config: the service stores it as a full dump and validates that again, and
    `queues show` prints it, so they must not be implied."""
    order = config.order
    if order is None:  # a file that names `las` keeps it for the rest (las-share would clash)
        named = {queue.order for queue in config.queues.values()}
        order = "las" if "las" in named else DEFAULT_ORDER
    queues = {
        name: queue if queue.order else queue.model_copy(update={"order": order})
        for name, queue in config.queues.items()
    }
    config = config.model_copy(update={"order": order, "queues": queues})
    if not config.las_share():
        return config
    given = config.las.model_dump(include=config.las.model_fields_set)
    las = LasSettings.model_validate({**LAS_SHARE_DEFAULTS, **given})
    return config.model_copy(update={"las": las})


def _reference_problems(config: QueueConfig) -> list[str]:
    """The rules that span fields: names, declared cohorts, what a borrowing limit refers to."""
    problems = []
    if len(config.queues) > MAX_QUEUES:
        problems.append(f"queues: {len(config.queues)} queues; at most {MAX_QUEUES}")
    for name in config.cohorts:
        if not re.match(NAME_PATTERN, name):
            problems.append(f"cohorts: {short(name)} is not a valid name ({_NAME_RULE})")
    declared = set(config.cohorts)
    for name, queue in config.queues.items():
        where = f"queues.{name}"
        if not re.match(NAME_PATTERN, name):
            problems.append(f"queues: {short(name)} is not a valid queue name ({_NAME_RULE})")
        for resource in [*queue.nominal, *(queue.borrowing_limit or {})]:
            if not resource.strip():
                problems.append(f"{where}: resource names must not be empty")
        if queue.cohort is not None and queue.cohort not in declared:
            known = ", ".join(sorted(declared)) or "none declared"
            problems.append(f"{where}.cohort: unknown cohort {short(queue.cohort)} (cohorts: {known})")
        if queue.borrowing_limit is not None:
            if queue.cohort is None:
                problems.append(f"{where}.borrowing_limit: only a queue in a cohort borrows; set cohort")
            for resource in queue.borrowing_limit:
                if resource not in queue.nominal:
                    problems.append(
                        f"{where}.borrowing_limit.{resource}: no nominal quota of {resource} to borrow beyond"
                    )
        if queue.cohort is not None and not queue.nominal:
            problems.append(f"{where}.nominal: a queue in a cohort needs a nominal quota (0 is allowed)")
        problems += _team_problems(f"{where}.teams", queue.teams)
    thresholds = config.las.thresholds_gpu_s
    if any(a >= b for a, b in zip(thresholds, thresholds[1:])):
        problems.append(f"las.thresholds_gpu_s: must be ascending without repeats (got {thresholds})")
    return problems


def _order_problems(config: QueueConfig) -> list[str]:
    """One LAS serves every LAS queue of a file, with one tuning: `las` and `las-share` don't mix
    (the file's own `order` counts as one more queue's)."""
    first = {}  # order -> the queue that first names it (None: the file's own `order`)
    if config.order:
        first[config.order] = None
    for name, queue in sorted(config.queues.items()):
        if queue.order:
            first.setdefault(queue.order, name)
    if not all(order in first for order in LAS_ORDERS):
        return []
    share, las = first["las-share"], first["las"]
    where = "order" if share is None else f"queues.{share}.order"
    named = "the file's order" if las is None else f"queue {short(las)}"
    return [
        f"{where}: las-share cannot be mixed with las in one file ({named} is las);"
        " give every LAS queue the same order"
    ]


def _team_problems(where: str, teams: list[str] | None) -> list[str]:
    if teams is None:
        return []
    if not teams:
        return [f"{where}: an empty list admits no team; leave teams out to admit every team"]
    problems = [
        f"{where}: {short(team)} is not a valid team name ({_NAME_RULE})"
        for team in teams
        if not re.fullmatch(NAME_PATTERN, team)
    ]
    repeated = sorted({team for team in teams if teams.count(team) > 1})
    if repeated:
        problems.append(f"{where}: {', '.join(map(short, repeated))} listed more than once")
    return problems


_NAME_RULE = "lowercase letters, digits, '-', '_' or '.', starting with a letter or digit"


DEFAULT_QUEUES = validate_queue_config({})  # no queue file: every queue has the default order
