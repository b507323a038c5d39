"""What the training loop carries from step to step and a checkpoint keeps.

The trainer owns one `TrainState`; its components are handed it: the checkpointer saves it and
restores it in place on resume, the metrics processor and the evaluator add their records to
its history, the evaluator keeps the early-stopping state in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TrainState:
    """What the loop carries from step to step and a checkpoint keeps."""

    step: int = 0
    best_eval_loss: float = math.inf
    evals_without_improvement: int = 0
    history: list[dict] = field(default_factory=list)
