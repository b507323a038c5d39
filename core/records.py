"""Metrics records: what the training loop logs, the driver forwards, the service keeps, the
metrics log stores and the page, the exporter and `orchestrator metrics` read.

A record is a flat dict with an integer `step`. Its kind follows from its fields, decided
here and nowhere else:

    train  rank 0's record of a logged step: `loss`, `lr`, `samples_per_s`, the step-time
           split, memory, ... (`rank` 0)
    eval   an evaluation: `eval_loss`, `eval_accuracy`, `eval_perplexity`
    rank   a record another rank sends of itself: its step-time split and memory (`rank` > 0)
"""

from __future__ import annotations

TRAIN, EVAL, RANK = "train", "eval", "rank"

STEP = "step"
TIME = "time"
LOSS = "loss"
LR = "lr"
GRAD_NORM = "grad_norm"
SAMPLES_PER_S = "samples_per_s"
TOKENS_PER_S = "tokens_per_s"
TOTAL_STEPS = "total_steps"
CHECKPOINT_SAVE_S = "checkpoint_save_s"  # training blocked by the save
CHECKPOINT_DURABLE_S = "checkpoint_durable_s"  # from the save's start until complete in storage
CHECKPOINT_BYTES = "checkpoint_bytes"
EVAL_PREFIX = "eval_"


def kind_of(record: dict) -> str | None:
    """TRAIN, EVAL, RANK, or None for a record of none of these kinds."""
    if LOSS in record:
        return TRAIN
    if any(key.startswith(EVAL_PREFIX) for key in record):
        return EVAL
    if record.get("rank", 0):
        return RANK
    return None


def is_train(record: dict) -> bool:
    return LOSS in record


def is_eval(record: dict) -> bool:
    return kind_of(record) == EVAL


def is_eval_field(name: str) -> bool:
    return name.startswith(EVAL_PREFIX)


def eval_fields(record: dict) -> dict[str, float]:
    """An eval record's numbers, by their short names: {"loss": ..., "accuracy": ...}."""
    return {
        key.removeprefix(EVAL_PREFIX): value
        for key, value in record.items()
        if key.startswith(EVAL_PREFIX) and isinstance(value, (int, float))
    }


def format_eval(metrics: dict) -> str:
    """'loss 0.3120  accuracy 0.9050' for an eval record or an eval summary."""
    return "  ".join(f"{name} {value:.4f}" for name, value in eval_fields(metrics).items())
