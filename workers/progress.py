"""Progress on rank 0: a rich progress bar on a terminal, plain log lines anywhere else."""

from __future__ import annotations

import sys
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


PLAIN_EVERY_S = 2.0  # plain lines at most this often (and always the last step): logs stay readable


class ProgressReporter:
    def __init__(
        self, job: str, total_steps: int, start_step: int, enabled: bool, interactive: bool | None = None
    ):
        self.job, self.total, self.enabled = job, total_steps, enabled
        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        self.start_step, self.start_time = start_step, time.perf_counter()
        self._bar = None
        self._printed_at: float | None = None
        if enabled and self.interactive:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._bar.add_task(job, total=total_steps, completed=start_step, info="")
            self._bar.start()

    def eta(self, step: int) -> float:
        done = step - self.start_step
        if done <= 0:
            return float("nan")
        return (time.perf_counter() - self.start_time) / done * (self.total - step)

    def update(self, step: int, loss: float, samples_per_s: float, lr: float) -> None:
        if not self.enabled:
            return
        info = f"loss {loss:.4f}  {samples_per_s:,.0f} samples/s  lr {lr:.2e}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        else:
            now = time.perf_counter()
            if self._printed_at is not None and now - self._printed_at < PLAIN_EVERY_S and step < self.total:
                return
            self._printed_at = now
            eta = self.eta(step)
            eta_text = format_duration(eta) if eta == eta else "?"
            print(f"[{self.job}] step {step}/{self.total}  {info}  eta {eta_text}", flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(f"[{self.job}] {text}", flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
