"""What `orchestrator run` and `orchestrator submit --wait` show while jobs run.

On a terminal: a live rich panel per job (state, step/total with a bar, loss, throughput, ETA)
that updates in place, with events ("queued behind 2 jobs", "preempted at step 340",
"checkpoint at step 500") printed above it as they happen. Anywhere else (a log file, Ray's
job logs, CI): the same events and a progress line per logged step, as plain lines.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


@dataclass
class JobLine:
    job: str
    state: str = "starting"
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    rate: float | None = None
    rate_unit: str = "samples/s"
    eta_s: float | None = None
    note: str | None = None
    updated: float = field(default_factory=time.time)


STATE_STYLE = {
    "queued": "yellow",
    "preempted": "yellow",
    "stopping": "yellow",
    "admitted": "cyan",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "stopped": "magenta",
}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Display:
    """Live panels on a terminal, plain lines elsewhere; use as a context manager.

    Plain progress lines come at most every `plain_every_s` per job (and always for the last
    step), so a job logging every step does not flood a log file."""

    plain_every_s = 2.0

    def __init__(self, live: bool | None = None, stream=None):
        self.stream = stream or sys.stdout
        self.live_mode = self.stream.isatty() if live is None else live
        self.console = Console(file=self.stream, highlight=False)
        self.jobs: dict[str, JobLine] = {}
        self._live: Live | None = None
        self._printed_at: dict[str, float] = {}
        self._printed_step: dict[str, int | None] = {}

    def __enter__(self) -> Display:
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None

    def event(self, job: str, text: str) -> None:
        """A state change or a notable moment: always a line of its own."""
        line = f"[{job}] {text}"
        if self._live is not None:
            self._live.console.print(Text(line))
        else:
            print(line, file=self.stream, flush=True)

    def progress(self, job: str, text: str, **values) -> None:
        """A logged step: a plain line where there is no terminal, the live panel where there is."""
        if self._live is None:
            now, last = time.monotonic(), self._printed_at.get(job)
            line = self.jobs.get(job)
            step, total = values.get("step"), values.get("total") or (line.total if line else None)
            last_step = bool(total) and step is not None and step >= total
            again = step is not None and step == self._printed_step.get(job)  # read again, not new
            if not again and (last is None or now - last >= self.plain_every_s or last_step):
                self._printed_at[job], self._printed_step[job] = now, step
                print(f"[{job}] {text}", file=self.stream, flush=True)
        self.update(job, **values)

    def update(self, job: str, **values) -> None:
        """New values for a job's panel (state, step, total, loss, rate, rate_unit, eta_s, note)."""
        line = self.jobs.setdefault(job, JobLine(job))
        for key, value in values.items():
            setattr(line, key, value)
        line.updated = time.time()
        if self._live is not None:
            self._live.update(self._render())

    def _render(self):
        rows = []
        for line in self.jobs.values():
            head = Table.grid(padding=(0, 2))
            head.add_column(no_wrap=True)
            head.add_column(no_wrap=True)
            head.add_column(no_wrap=True)
            head.add_column()
            style = STATE_STYLE.get(line.state, "white")
            total = f"/{line.total}" if line.total else ""
            head.add_row(
                Text(line.job, style="bold"),
                Text(line.state, style=style),
                Text(f"step {line.step if line.step is not None else '-'}{total}"),
                Text(
                    "   ".join(
                        part
                        for part in (
                            f"loss {line.loss:.4f}" if line.loss is not None else "",
                            f"{line.rate:,.0f} {line.rate_unit}" if line.rate else "",
                            f"ETA {_duration(line.eta_s)}" if line.eta_s is not None else "",
                            line.note or "",
                        )
                        if part
                    ),
                    style="dim",
                ),
            )
            rows.append(head)
            if line.total and line.step is not None:
                rows.append(ProgressBar(total=line.total, completed=min(line.step, line.total), width=60))
        return Group(*rows) if rows else Text("")
