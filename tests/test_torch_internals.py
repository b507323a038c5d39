"""torch's private surface, held at one door: `workers/torch_internals.py`; each symbol checked
against the installed torch (tests/test_ray_internals.py checks that nothing else reaches it)."""

import pytest
import torch

from workers import torch_internals


@pytest.mark.parametrize("use", torch_internals.USES, ids=lambda use: use.symbol)
def test_each_private_symbol_is_what_the_project_relies_on(use):
    assert torch_internals.problem(use) is None, torch_internals.problem(use)
    assert use.why


def test_a_renamed_symbol_fails_with_one_line_naming_it_and_the_version(monkeypatch):
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper

    use = torch_internals.USES[0]
    monkeypatch.delattr(checkpoint_wrapper, "checkpoint_wrapper")
    line = torch_internals.problem(use)
    assert line.startswith(use.symbol) and f"torch {torch.__version__}" in line and "\n" not in line


def test_a_wrapped_block_computes_what_the_block_does():
    block = torch.nn.Linear(4, 4)
    wrapped = torch_internals.checkpoint_wrapper(block)
    x = torch.randn(2, 4, requires_grad=True)
    assert torch_internals.is_checkpoint_wrapped(wrapped) and not torch_internals.is_checkpoint_wrapped(block)
    torch.testing.assert_close(wrapped(x), block(x))
    assert set(wrapped.state_dict()) == set(block.state_dict())  # no wrapper prefix
