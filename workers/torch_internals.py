"""Every use of torch's private surface, in one place, each with why no public API serves.

As `orchestrator/ray/internals.py` is for Ray: the rest of the project uses torch's public APIs
only (tests/test_ray_internals.py checks the source), and tests/test_torch_internals.py checks
every entry of `USES` against the installed torch, failing with one line that names the symbol
and torch's version.
"""

from __future__ import annotations

from core import private_api
from core.private_api import Private

WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
USES: tuple[Private, ...] = (
    Private(
        f"{WRAPPER}:checkpoint_wrapper",
        "function",
        ("module", "checkpoint_impl", "checkpoint_fn"),
        "activation checkpointing of a block as a module (torchtitan's apply_ac uses it): its "
        "prefix is removed from state dicts by the wrapper and by torch.distributed.checkpoint, "
        "which torch.utils.checkpoint.checkpoint around a forward does not arrange",
    ),
    Private(f"{WRAPPER}:CheckpointWrapper", "class", None, "what `checkpoint_wrapper` returns"),
)


def problem(use: Private) -> str | None:
    """None when `use` holds on the installed torch, else one line naming it and the version."""
    return private_api.problem(use, "torch")


def checkpoint_wrapper(module, **options):
    """`module` wrapped so that its activations are recomputed in backward (non-reentrant)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper as wrap

    return wrap(module, **options)


def is_checkpoint_wrapped(module) -> bool:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return isinstance(module, CheckpointWrapper)
