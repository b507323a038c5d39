"""Replica groups (`fault_tolerance.replica_groups`): a job that trains on through the loss of
a group of its workers, and a replacement group that heals from a live peer (torchft).

The job's workers form equal groups, each a data-parallel world of its own (its process group,
DDP or FSDP2 inside it: with FSDP2, HSDP). Across the groups, torchft's `Manager` keeps the
quorum of the live ones through its lighthouse, and each step of the loop goes:

    begin      the step's quorum; a group behind the others (a replacement) heals first: it
               loads a peer's model, optimizer, schedule and loop state (`state_dict`), so the
               loop carries on from the peer's step
    average    the gradients averaged over the groups in the quorum (one flat all-reduce)
    commit     the optimizer steps only if every group of the quorum got through the step: a
               peer lost mid-step fails the all-reduce, no group steps, and the same step is
               tried again with the groups that remain (its batch is spent)

One group leads, the first in the quorum: members rank by their ids, which begin with the time
the group joined, so the oldest group leads while it lives. Only the leader's workers write
checkpoints and metrics, so the job's log has each step once whichever group is lost; a group
that comes to lead starts its own version of the log from its history (metrics_processor.py),
with the few records a healed group never had (its peer's, still being summed when the peer
sent its state) read back from the log: the leader writes those to storage as soon as it logs
them (`lacked_by_a_joined_group`), so a leader lost seconds after a heal takes none with it.
The loop asks `stop_agreed` each step for a stop request of any group (the largest code), so
that every group stops at the same step; a group its launcher judged lost and told to leave
takes part in that step's agreement, then leaves alone (`Trainer.run`), and the others' next
quorum goes on without it.

Across the groups the collectives go over gloo (torchft's `ProcessGroupGloo`), on CPUs as on
GPUs for now: NCCL between groups (torchft's own NCCL group) is for the GPU path to measure.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.distributed import ReduceOp

from core import records
from core.metrics_log import read_metrics

log = logging.getLogger("workers")

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"  # torchft's own name for the lighthouse's address
GROUP_ENV = "REPLICA_GROUP_ID"  # which group this process is in (torchft's examples' name)
TIMEOUT = timedelta(seconds=30)  # a collective, a commit, a transfer of state: then the peer is lost
QUORUM_TIMEOUT = timedelta(seconds=120)  # a step waits this long for a quorum of one group at least


class Replicas:
    """This worker's replica group among the job's: the quorum each step, the gradients averaged
    over the groups, the state a new group heals from."""

    def __init__(
        self,
        group: int,
        groups: int,
        rank: int,
        world_size: int,
        lighthouse: str,
        state_dict: Callable[[], dict],
        load_state_dict: Callable[[dict], int],
        job: str,
        store: tuple[str, int] | None = None,
    ):
        """`store`: the group's TCPStore (host, port); by default its process group's
        (MASTER_ADDR and MASTER_PORT, as torchrun and the Ray launcher set them)."""
        from torchft import Manager, ProcessGroupGloo
        from torchft.checkpointing.pg_transport import PGTransport

        self.group, self.groups, self.rank = group, groups, rank
        self._load = load_state_dict
        self.healed_at: list[int] = []  # the steps this group healed at (a replacement: one)
        # steps (after, up to] whose records the peer had not finished when it sent its state
        self.missing: tuple[int, int] | None = None
        # the job's log as this group starts to write it (`join` sets the loop's)
        self.log_from_here: Callable[[], list[dict]] = list
        self._healed = False  # since the loop last asked
        self._participants = 0  # in the quorum of the step before
        # the newest step at which a group joined: records up to it that this group logs from
        # then on are ones the joined group lacks (its peer had not finished them)
        self.joined_at: int | None = None
        self.steps_retried = 0
        self.steps_degraded = 0
        pg = ProcessGroupGloo(timeout=TIMEOUT)
        self.manager = Manager(
            pg=pg,
            min_replica_size=1,
            load_state_dict=self._heal,
            state_dict=state_dict,
            use_async_quorum=False,  # heal before the forward pass: the step's batch is the peer's
            timeout=TIMEOUT,
            quorum_timeout=QUORUM_TIMEOUT,
            rank=rank,
            world_size=world_size,
            lighthouse_addr=lighthouse,
            # ranked by id in the quorum: the group that joined first leads; torchft reads the
            # group from the id's trailing digits
            replica_id=f"{job}-{time.time_ns()}-group{group}",
            store_addr=store[0] if store else None,
            store_port=store[1] if store else None,
            checkpoint_transport=PGTransport(pg, timeout=TIMEOUT, device=torch.device("cpu")),
        )

    def _heal(self, state: dict) -> None:
        last_record = self._load(state)
        self._healed = True
        self.healed_at.append(self.manager.current_step())
        self.missing = (last_record, self.manager.current_step())
        log.info("replica group %d healed from a peer at step %d", self.group, self.manager.current_step())

    def take_healed(self) -> bool:
        """Whether this group loaded a peer's state since the last call."""
        healed, self._healed = self._healed, False
        return healed

    def continue_from(self, step: int) -> None:
        """After a resume from a checkpoint: the quorum counts steps from there."""
        self.manager.load_state_dict({"step": step, "batches_committed": step * self.groups})

    def begin(self) -> None:
        """The step's quorum (and, for a group behind its peers, the peer's state loaded)."""
        self.manager.start_quorum()
        participants = self.participants
        if self._participants and participants > self._participants:
            self.joined_at = self.manager.current_step()
        self._participants = participants

    def lacked_by_a_joined_group(self, step: int) -> bool:
        """Whether the record of `step`, finished only now, is one a group that joined lacks:
        should this group be lost, that group reads it back from the log (`log_from_here`), so
        it must be in storage at once, not at the log's next flush."""
        return self.joined_at is not None and step <= self.joined_at

    def average(self, model: nn.Module) -> None:
        """Each gradient, averaged over the groups of the quorum: this rank's part of it, a
        shard under FSDP2 (HSDP: each rank averages its shard with the same rank's of the
        other groups, which hold the same shard)."""
        grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.manager.allreduce(flat).wait()  # a group that is healing adds zeros
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def commit(self) -> bool:
        """Whether every group of the quorum got through the step (then the optimizer steps)."""
        committed = self.manager.should_commit()
        if not committed:
            self.steps_retried += 1
        elif self.participants < self.groups:
            self.steps_degraded += 1
        return committed

    def summary(self) -> dict:
        """This group's part in the run's summary."""
        return {
            "group": self.group,
            "groups": self.groups,
            "healed_at": self.healed_at,
            "steps_retried": self.steps_retried,  # a group lost mid-step: the step again
            "steps_degraded": self.steps_degraded,  # taken with fewer groups than the job has
        }

    def stop_agreed(self, code: int) -> int:
        """A stop request of any group (the largest code), the same in every group."""
        flag = torch.tensor([float(code)])
        self.manager.allreduce(flag, reduce_op=ReduceOp.MAX).wait()
        return int(flag.item())

    @property
    def participants(self) -> int:
        return self.manager.num_participants()

    @property
    def leads(self) -> bool:
        """The first group of the quorum writes the job's checkpoints and metrics."""
        return self.manager.participating_rank() == 0

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def join(spec, ctx, *, state, model, optimizer, scheduler, scaler) -> Replicas | None:
    """This worker's place in the job's replica groups (`ctx.replica_group`), with the loop's
    parts a late group loads from it, or None for a job of one group."""
    groups = spec.fault_tolerance.replica_groups
    if groups == 1:
        return None
    parts = LoopState(state, model, optimizer, scheduler, scaler)
    store = None if "MASTER_ADDR" in os.environ else _own_store()  # a process alone: a store of its own
    replicas = Replicas(
        ctx.replica_group,
        groups,
        ctx.rank,
        ctx.world_size,
        lighthouse_address(),
        parts.state_dict,
        parts.load_state_dict,
        job=spec.name,
        store=store,
    )
    replicas.log_from_here = functools.partial(log_from_here, state, replicas, ctx.run_uri)
    return replicas


@dataclass
class LoopState:
    """What a group that joins late loads from a peer: the model, the optimizer, the schedule,
    the loss scaler and the loop's state (its step, its early-stopping count, its log history)."""

    state: Any
    model: nn.Module
    optimizer: Any
    scheduler: Any
    scaler: Any

    def state_dict(self) -> dict:
        state = self.state
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train": [state.step, state.best_eval_loss, state.evals_without_improvement, state.history],
        }

    def load_state_dict(self, peer: dict) -> int:
        """Load a peer's state; returns the newest step its history holds."""
        self.model.load_state_dict(peer["model"])
        self.optimizer.load_state_dict(peer["optimizer"])
        self.scheduler.load_state_dict(peer["scheduler"])
        self.scaler.load_state_dict(peer["scaler"])
        state = self.state
        state.step, state.best_eval_loss, state.evals_without_improvement, history = peer["train"]
        state.history = list(history)
        return max((r[records.STEP] for r in history), default=0)


def log_from_here(state, replicas: Replicas, run_uri: str) -> list[dict]:
    """The job's log as this group starts to write it: its history, and the records a heal left
    it without, read back from the log the last leader wrote."""
    history = list(state.history)
    if replicas.missing is None:
        return history
    after, upto = replicas.missing

    def key(record: dict) -> tuple[int, bool]:  # the log's order: a step's training record first
        return record[records.STEP], records.is_eval(record)

    have = {key(r) for r in history}
    try:
        written = read_metrics(run_uri)
    except OSError as err:  # the log as this group has it, less those records
        log.warning("cannot read the metrics log (%s): steps %d-%d may lack records", err, after, upto)
        written = []
    missing = [r for r in written if after < r[records.STEP] <= upto and key(r) not in have]
    return sorted(history + missing, key=key)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (FSDP2's parameters and gradients), else the tensor."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def data_position(spec, ctx) -> tuple[int, int]:
    """(rank, world size) of this worker in the job's data: each group its own share."""
    groups = spec.fault_tolerance.replica_groups
    return ctx.replica_group * ctx.world_size + ctx.rank, groups * ctx.world_size


def _own_store() -> tuple[str, int]:
    from torch.distributed import TCPStore

    global _STORE  # kept alive for the process: the manager's group reads it
    _STORE = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    return "127.0.0.1", _STORE.port


_STORE = None


def lighthouse_address() -> str:
    address = os.environ.get(LIGHTHOUSE_ENV)
    if not address:
        raise RuntimeError(
            f"fault_tolerance.replica_groups: no lighthouse ({LIGHTHOUSE_ENV} is not set; start one "
            "with `torchft_lighthouse --min_replicas 1` and pass its address)"
        )
    return address
