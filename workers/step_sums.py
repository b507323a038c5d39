"""Sums over the ranks that training never waits for: the logged losses, the non-finite flag
and rank 0's stop request.

Waiting for such a sum at once makes a step wait for the slowest rank and, on a GPU, for the
device (a `.item()` per step). Started without waiting instead, it is long finished one step
later: the collectives of the next step come after it on the same process group, so reading it
then costs nothing. And one sum serves all the steps logged since the one before, so logging
every step does not add a collective per step.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

MAX_INTERVAL = 1000  # steps between sums, whatever the pace


def _scalar(value: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    if torch.is_tensor(value):
        return value.detach().reshape(()).to(torch.float32)
    # filled on the device: a host-to-device copy would wait for the stream
    return torch.full((), float(value), dtype=torch.float32, device=device)


class DeferredSum:
    """One sum in flight at a time: `start` it after a step, `finish` it after the next."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pending: tuple[torch.Tensor, Any, Any, Any] | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def start(
        self,
        values: torch.Tensor | list[torch.Tensor | float],
        payload: Any = None,
        local: torch.Tensor | None = None,
    ) -> None:
        """Begin summing `values` (a 1-d float32 tensor on the device, or a list of 0-d tensors
        and numbers) over the ranks. `local` (a 1-d float32 tensor on the device) is read back
        with the sum but not summed: device values this rank alone needs (the gradient norm)."""
        if self._pending is not None:
            raise RuntimeError("DeferredSum.start while a sum is in flight: finish() it first")
        tensor = values if torch.is_tensor(values) else torch.stack([_scalar(v, self.device) for v in values])
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        work = dist.all_reduce(tensor, async_op=True) if distributed else None
        event = None
        if tensor.is_cuda:
            if work is not None:
                work.wait()  # the stream waits for the sum; the host does not
                work = None
            if local is not None:  # one copy to the host for both
                tensor, local = torch.cat([tensor, local]), None
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            tensor = host
        self._pending = (tensor, local, work, event, payload)

    def finish(self) -> tuple[list[float], Any] | None:
        """(the summed values followed by the `local` values, the payload given to `start`);
        None when nothing is in flight."""
        if self._pending is None:
            return None
        tensor, local, work, event, payload = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        if event is not None:
            event.synchronize()
        values = tensor.tolist()
        if local is not None:
            values += local.tolist()
        return values, payload

    def discard(self) -> None:
        """Forget the sum in flight (after a failure: the other ranks may never join it)."""
        self._pending = None


class StepSums:
    """Logged records wait here with their rank-local loss until a sum over the ranks completes
    them. Each sum also carries the non-finite flag, rank 0's stop request, and rank 0's choice
    of when the next sum is due: about every `every_s` seconds, and every step when steps are
    slower than that. So logging every step costs one small collective per `every_s`, never one
    per step, and a stop request reaches all ranks at the same step within about `every_s`.

    Logging every step makes this a per-step path: a step adds its record and loss as they are
    (no tensor op), and each sum stacks all the waiting values at once.
    """

    def __init__(self, device: torch.device, world_size: int, is_main: bool, every_s: float = 0.25):
        self.device, self.world_size, self.is_main, self.every_s = device, world_size, is_main, every_s
        self.sum = DeferredSum(device)
        # (record or None, this rank's loss: a 0-d float32 tensor, {field: 0-d device tensor})
        self.waiting: list[tuple[dict | None, torch.Tensor, dict | None]] = []
        self.due_step = 0  # the first sum: at the first step
        # rank 0: (step, time) of the last sum started; None before the first, whose pace is
        # unknown (a resumed run starts at its checkpoint's step, not at 0): it sums again next step
        self._last: tuple[int, float] | None = None

    def add(
        self, record: dict | None, loss: torch.Tensor, on_device: dict[str, torch.Tensor] | None = None
    ) -> None:
        """A logged step: its record (None on a rank whose records nobody keeps), this rank's
        loss, and fields still on the device (the gradient norm), read with the sum."""
        self.waiting.append((record, loss, on_device))

    def due(self, step: int) -> bool:
        return step >= self.due_step

    @property
    def in_flight(self) -> bool:
        return self.sum.pending

    def start(self, step: int, nonfinite: torch.Tensor, stop_code: int) -> None:
        """Begin the sum of the waiting records' losses, the flags, and the next due step."""
        interval = 0
        if self.is_main:  # steps per `every_s` at the pace since the last sum
            now = time.perf_counter()
            interval = 1
            if self._last is not None:
                last_step, last_time = self._last
                step_s = (now - last_time) / max(step - last_step, 1)
                interval = max(1, min(MAX_INTERVAL, int(self.every_s / max(step_s, 1e-9))))
            self._last = (step, now)
        waiting, self.waiting = self.waiting, []
        flags = torch.stack(
            [nonfinite.to(torch.float32), _scalar(stop_code, self.device), _scalar(interval, self.device)]
        )
        values = (
            torch.cat([torch.stack([loss for _, loss, _ in waiting]).float(), flags]) if waiting else flags
        )
        keys = [(record, key) for record, _, fields in waiting if fields for key in fields]
        local = None
        if keys:
            local = torch.stack([fields[key] for _, _, fields in waiting if fields for key in fields]).float()
        records = [record for record, _, _ in waiting]
        self.sum.start(values, (step, records, keys), local=local)

    def finish(self) -> tuple[int, list[dict], bool, int] | None:
        """(start step, completed records, non-finite seen, stop code) of the sum in flight."""
        finished = self.sum.finish()
        if finished is None:
            return None
        values, (step, records, keys) = finished
        summed = len(records) + 3
        nonfinite, stop_code, interval = values[summed - 3 : summed]
        for record, loss in zip(records, values[: len(records)], strict=True):
            if record is not None:
                record["loss"] = loss / self.world_size
        for (record, key), value in zip(keys, values[summed:], strict=True):
            if record is not None:
                record[key] = value
        self.due_step = step + max(1, int(interval))
        return step, [r for r in records if r is not None], bool(nonfinite), int(stop_code)

    def discard(self) -> None:
        self.sum.discard()
        self.waiting = []
