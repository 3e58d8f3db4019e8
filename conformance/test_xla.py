"""Checks of XLA cells: one gradient reduction per window, after its last backward, then one graph cut."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.harness import make_batches, make_model, run_steps
from lightning_optimizer.conformance.outcomes import not_applicable, unavailable
from lightning_optimizer.spec import Cell, ImplementationInfo, TrainingContext

MakeContext = Callable[..., TrainingContext]


@pytest.mark.requirement("XLA-001")
@pytest.mark.cells(devices=("xla",))
def test_one_reduction_per_window_after_its_last_backward(
    make_context: MakeContext, cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two windows of three micro-steps: backward x3, reduce, sync; backward x3, reduce, sync.

    torch_xla's own ``reduce_gradients`` and ``sync`` are observed (and still run); a backward pass is seen
    through a gradient hook on the first parameter.
    """
    import torch_xla
    import torch_xla.core.xla_model as xm

    events: list[str] = []
    reduce_gradients, sync = xm.reduce_gradients, torch_xla.sync

    def observed_reduce(*args: Any, **kwargs: Any) -> Any:
        events.append("reduce")
        return reduce_gradients(*args, **kwargs)

    def observed_sync(*args: Any, **kwargs: Any) -> Any:
        events.append("sync")
        return sync(*args, **kwargs)

    monkeypatch.setattr(xm, "reduce_gradients", observed_reduce)
    monkeypatch.setattr(torch_xla, "sync", observed_sync)
    context = make_context(accumulate_grad_batches=3)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    first = next(model.parameters())

    def observe_backward(grad: torch.Tensor) -> torch.Tensor:
        events.append("backward")
        return grad

    first.register_hook(observe_backward)
    run_steps(context, model, wrapper, make_batches(6), cell)
    window = ["backward"] * 3 + ["reduce", "sync"]
    assert events == window * 2, f"XLA events over two windows of three micro-steps: {events}"


@pytest.mark.requirement("ERR-006")
def test_xla_without_torch_xla_names_it(implementation: ImplementationInfo[Any]) -> None:
    """Asking for device ``xla`` where torch_xla cannot be imported raises an error that names torch_xla."""
    if "xla" not in implementation.devices:
        not_applicable("not claimed (device xla)")
    if importlib.util.find_spec("torch_xla") is not None:
        unavailable("torch_xla is installed here, so its absence cannot be checked")
    with pytest.raises(Exception, match="torch_xla") as raised:
        implementation.factory(Cell("xla", "32-true"))
    assert not isinstance(raised.value, AssertionError)
