"""Throughput accounting shared by every strategy: samples/s, tokens/s, FLOP/s and MFU.

Model FLOPs per sample are counted once, with `torch.utils.flop_counter.FlopCounterMode`
over one forward and backward of a meta-device copy of the model (no memory, no compute):
2 FLOPs per multiply-add, matmuls, convolutions and attention. They are *model* FLOPs:
activation-checkpoint recomputation is not counted (it is work the hardware does, not
work the model needs), and causal attention is counted as full attention.

    achieved FLOP/s per worker = flops_per_sample x samples/s per worker
    MFU                        = achieved FLOP/s per worker / peak dense FLOP/s of the device

The peak is the dense (no sparsity) bf16/fp16 tensor-core figure of the device, looked up
by name. MFU is left out (None, with the reason) on a CPU, on an unknown GPU, for fp32 (no
tensor-core peak in the table) and for fp8: part of an fp8 run stays in bf16, so no single
peak describes it (torchtitan does the same).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# dense peaks in TFLOP/s: (bf16/fp16, fp8); most specific name first
PEAK_TFLOPS: list[tuple[str, tuple[float, float | None]]] = [
    ("B200", (2250.0, 4500.0)),
    ("H200", (989.0, 1979.0)),
    ("H100 NVL", (835.0, 1671.0)),
    ("H100 PCIe", (756.0, 1513.0)),
    ("H100", (989.0, 1979.0)),  # SXM
    ("A100", (312.0, None)),
    ("L40S", (362.0, 733.0)),
]


def peak_tflops(device_name: str) -> tuple[float, float | None] | None:
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peaks
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def mfu(achieved_flops_per_s: float, device_name_: str, dtype: str) -> tuple[float | None, str]:
    """(MFU as a fraction, or None; a note saying against what, or why not)."""
    if dtype == "fp8":
        return None, "no MFU for fp8: part of the model runs in bf16, so no single peak applies"
    if dtype == "fp32":
        return None, "no MFU for fp32: the peak table holds 16-bit tensor-core peaks"
    peaks = peak_tflops(device_name_)
    if peaks is None:
        return None, f"no MFU: no peak FLOP/s known for '{device_name_}'"
    return achieved_flops_per_s / (peaks[0] * 1e12), f"against the {peaks[0]:g} TFLOP/s dense bf16 peak"


# --- FLOP counting --------------------------------------------------------------------


def count_train_flops(model: nn.Module, example: torch.Tensor) -> int:
    """FLOPs of one forward + backward of `model` on `example` (any device, meta included)."""
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(example)
        out.float().sum().backward()
    return int(counter.get_total_flops())


def train_flops_per_sample(model_spec: Any, data_info: Any) -> int:
    """Model FLOPs of one training sample (forward + backward), counted on the meta device."""
    import kernels as kernel_ops
    from workers import models

    # the plain torch kernels compute the same math and run on meta
    kernels = {op: "torch" for op in kernel_ops.OPS}
    model_spec = copy.deepcopy(model_spec)
    if model_spec.family == "gpt":  # padding the vocabulary is no model work: count the real one
        model_spec.overrides = {**(model_spec.overrides or {}), "vocab_multiple": 1}
    with torch.device("meta"):
        model = models.build(model_spec, data_info, kernels=kernels)
        if getattr(data_info, "kind", "image") == "tokens":
            example = torch.zeros(1, data_info.seq_len, dtype=torch.long)
        else:
            example = torch.zeros(1, data_info.in_channels, data_info.image_size, data_info.image_size)
    return count_train_flops(model, example)


# --- the meter ------------------------------------------------------------------------


def process_started() -> float:
    """When this process started (wall clock), from the kernel's own record of it."""
    import psutil

    return psutil.Process().create_time()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Meter:
    """Times training steps, leaving out the first (warm-up, compilation) and pauses (eval, save)."""

    device: torch.device
    samples_per_step: int  # global batch
    tokens_per_sample: int  # sequence length for language models, else 1
    world_size: int
    flops_per_sample: int | None = None
    dtype: str = "fp32"
    compiled: bool = False
    first_step_s: float | None = None
    _start: float = field(default_factory=time.perf_counter)
    _steady_from: float | None = None
    _steady_steps: int = 0
    _paused_s: float = 0.0
    _log_factors: list[tuple[str, float]] | None = None

    def step_done(self) -> None:
        if self.first_step_s is None:
            synchronize(self.device)
            now = time.perf_counter()
            self.first_step_s, self._steady_from = now - self._start, now
        else:
            self._steady_steps += 1

    def restart(self) -> None:
        """Call right before the first step (after resuming, building loaders, ...)."""
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def pause(self):
        """Time spent inside (evaluation, checkpointing) is not training time."""
        synchronize(self.device)  # queued training work is training time
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._steady_from is not None:
                self._paused_s += time.perf_counter() - start

    def steady_seconds(self) -> float:
        if self._steady_from is None:
            return 0.0
        synchronize(self.device)
        return max(time.perf_counter() - self._steady_from - self._paused_s, 0.0)

    def rates(self, samples_per_s: float) -> dict:
        """Per-worker and total rates, FLOP/s and MFU for a total samples/s."""
        per_worker = samples_per_s / self.world_size
        out = {
            "samples_per_s": samples_per_s,
            "samples_per_s_per_worker": per_worker,
        }
        if self.tokens_per_sample > 1:
            out["tokens_per_s"] = samples_per_s * self.tokens_per_sample
            out["tokens_per_s_per_worker"] = per_worker * self.tokens_per_sample
        if self.flops_per_sample:
            achieved = per_worker * self.flops_per_sample
            out["tflops_per_worker"] = achieved / 1e12
            name = device_name(self.device)
            value, note = (
                mfu(achieved, name, self.dtype)
                if self.device.type == "cuda"
                else (None, "no MFU on a CPU: achieved FLOP/s only")
            )
            out["mfu"], out["mfu_note"] = value, note
        return out

    def log_fields(self, samples_per_s: float) -> dict:
        """The rates worth a column in the per-step metrics log. Each is samples/s times a
        factor, worked out once: at `log_every: 1` this runs every step."""
        if self._log_factors is None:
            per_sample = self.rates(1.0)
            keys = ("tokens_per_s", "tflops_per_worker", "mfu")
            self._log_factors = [(k, per_sample[k]) for k in keys if per_sample.get(k) is not None]
        return {key: factor * samples_per_s for key, factor in self._log_factors}

    def summary(self) -> dict:
        seconds = self.steady_seconds()
        steps = self._steady_steps
        samples_per_s = steps * self.samples_per_step / seconds if steps and seconds else 0.0
        step_s = seconds / steps if steps else None
        out = {
            "device": device_name(self.device),
            "world_size": self.world_size,
            "dtype": self.dtype,
            "steady_steps": steps,
            "step_time_s": step_s,
            "first_step_s": self.first_step_s,
            "flops_per_step": self.flops_per_sample * self.samples_per_step
            if self.flops_per_sample
            else None,
            **self.rates(samples_per_s),
        }
        if self.compiled and step_s is not None and self.first_step_s is not None:
            # the first step compiles every graph of the training step
            out["compile_s"] = max(self.first_step_s - step_s, 0.0)
        return out


class PhaseTimer:
    """Mean time per step in each phase of the loop, over one logging interval.

    data: waiting for the next batch (host time: that is what the loop loses to the loader);
    compute: forward and backward; optimizer: unscale, clip, step, zero_grad. On a GPU the last
    two are CUDA events, read only once complete (no host sync), so they are the device's time,
    not the launch time; on a CPU the host clock is exact."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.enabled = True  # off: the phases are not timed (where nobody reads them)
        self._totals: dict[str, float] = {}
        self._events: list[tuple[str, Any, Any]] = []
        self._steps = 0

    @contextlib.contextmanager
    def host(self, name: str):
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self._totals[name] = self._totals.get(name, 0.0) + time.perf_counter() - start

    @contextlib.contextmanager
    def device(self, name: str):
        if not self.enabled:
            yield
            return
        if not self.cuda:
            with self.host(name):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        try:
            yield
        finally:
            end.record()
            self._events.append((name, start, end))

    def step_done(self) -> None:
        self._steps += 1

    def move(self, source: str, target: str, seconds: float) -> None:
        """Count `seconds` of host phase `source` as phase `target` instead."""
        seconds = min(seconds, self._totals.get(source, 0.0))
        self._totals[source] = self._totals.get(source, 0.0) - seconds
        self._totals[target] = self._totals.get(target, 0.0) + seconds

    def means(self) -> dict[str, float]:
        """{"data_s", "compute_s", "optimizer_s"}, and "sync_s" (`CollectiveWait`): means per
        step since the last call (then reset). Device phases count only the steps whose CUDA
        events have completed, so reading them never waits for the GPU; the others are counted
        at a later call."""
        out = {f"{name}_s": total / max(self._steps, 1) for name, total in self._totals.items()}
        device_totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        pending = []
        for name, start, end in self._events:
            if end.query():
                device_totals[name] = device_totals.get(name, 0.0) + start.elapsed_time(end) / 1e3
                counts[name] = counts.get(name, 0) + 1
            else:
                pending.append((name, start, end))
        out.update({f"{name}_s": total / counts[name] for name, total in device_totals.items()})
        self._totals, self._events, self._steps = {}, pending, 0
        return out


class CollectiveWait:
    """The part of a DDP rank's backward spent waiting for the other ranks, moved out of its
    `compute` phase into `sync`, so that `compute_s` is the rank's own work (what straggler
    detection compares across ranks).

    DDP launches each bucket's all-reduce as soon as its gradients are ready and waits for all
    of them when the backward ends. The last gradient this rank accumulates marks the end of
    its own backward; from there until `backward()` returns it waits for slower ranks. Host
    clock only (CPU, gloo): on a GPU the phases are CUDA events and the wait stays in them."""

    def __init__(self, model: nn.Module, timer: PhaseTimer):
        self.timer, self.ready = timer, None
        self.active = isinstance(model, nn.parallel.DistributedDataParallel) and not timer.cuda
        if self.active:
            for param in model.module.parameters():
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, _param) -> None:
        self.ready = time.perf_counter()

    def backward_done(self) -> None:
        """After the backward that synchronises the gradients."""
        if self.active and self.ready is not None and self.timer.enabled:
            self.timer.move("compute", "sync", time.perf_counter() - self.ready)
        self.ready = None


def memory_fields(device: torch.device) -> dict[str, int]:
    """Device memory of this worker (CUDA only): current, peak active, peak reserved bytes."""
    if device.type != "cuda":
        return {}
    return {
        "memory_allocated_bytes": torch.cuda.memory_allocated(device),
        "memory_peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "memory_peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
    }
