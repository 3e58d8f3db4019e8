"""Checks of bad input: a clear error, raised before anything changes."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.harness import make_batches, make_model, run_steps
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]


def _open_window(make_context: MakeContext, cell: Cell) -> tuple[torch.nn.Module, Any, list[torch.Tensor | None]]:
    """A wrapper with one accumulated micro-step (``accumulate_grad_batches=2``), and its gradients."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: False)
    return model, wrapper, [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def _assert_unchanged(model: torch.nn.Module, wrapper: Any, grads: list[torch.Tensor | None], what: str) -> None:
    for param, grad in zip(model.parameters(), grads, strict=True):
        assert grad is not None and param.grad is not None and torch.equal(param.grad, grad), f"{what} changed a grad"
    before = wrapper.last_outcome
    assert before is StepOutcome.ACCUMULATED, f"{what} changed the outcome to {before}"
    wrapper.step(make_optimizer_step=None)
    after = wrapper.last_outcome
    assert after is StepOutcome.STEPPED, f"after {what} the open window no longer closes on time"


@pytest.mark.requirement("ERR-001")
@pytest.mark.parametrize("closure", [3, "loss", [lambda: None]], ids=["int", "str", "list"])
def test_non_callable_closure(make_context: MakeContext, cell: Cell, closure: object) -> None:
    """A closure that is not callable raises ``TypeError`` and changes nothing."""
    model, wrapper, grads = _open_window(make_context, cell)
    with pytest.raises(TypeError, match=r"(?i)closure"):
        wrapper.step(closure)
    _assert_unchanged(model, wrapper, grads, f"step(closure={closure!r})")


@pytest.mark.requirement("ERR-002")
@pytest.mark.parametrize("value", [1, 0, "yes", 1.0, torch.tensor(True)], ids=["1", "0", "yes", "1.0", "tensor"])
def test_non_bool_make_optimizer_step(make_context: MakeContext, cell: Cell, value: object) -> None:
    """A ``make_optimizer_step`` that is not a ``bool`` or ``None`` raises ``TypeError`` and changes nothing."""
    model, wrapper, grads = _open_window(make_context, cell)
    calls = []
    with pytest.raises(TypeError, match="make_optimizer_step"):
        wrapper.step(lambda: calls.append(1), make_optimizer_step=value)
    assert calls == [], "the closure ran although make_optimizer_step was invalid"
    _assert_unchanged(model, wrapper, grads, f"make_optimizer_step={value!r}")


@pytest.mark.requirement("CTX-001")
@pytest.mark.parametrize("value", [0, -1, 2.0, True, "2"], ids=["0", "-1", "2.0", "True", "str"])
def test_invalid_accumulate_grad_batches(make_context: MakeContext, cell: Cell, value: object) -> None:
    """``accumulate_grad_batches`` that is not a positive ``int`` is refused at construction."""
    with pytest.raises((TypeError, ValueError), match="accumulate_grad_batches"):
        make_context(accumulate_grad_batches=value)


@pytest.mark.requirement("ERR-003")
@pytest.mark.parametrize(("field", "value"), [("precision", "fp17"), ("device", "tpu")])
def test_unknown_precision_or_device(
    implementation: ImplementationInfo[Any], cell: Cell, field: str, value: str
) -> None:
    """An unknown precision or device name raises ``ValueError`` naming it and the valid ones."""
    name: Any = value  # deliberately outside the Literal types
    bad = dataclasses.replace(cell, precision=name) if field == "precision" else dataclasses.replace(cell, device=name)
    with pytest.raises(ValueError, match=value) as raised:
        implementation.factory(bad)
    valid = "32-true" if field == "precision" else "cpu"
    assert valid in str(raised.value), f"the error does not list the valid names: {raised.value}"


@pytest.mark.requirement("ERR-004")
def test_wrapping_a_wrapper(make_context: MakeContext, cell: Cell) -> None:
    """Wrapping a wrapper raises ``TypeError``."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError):
        context.wrap(wrapper)  # type: ignore[type-var]
    with pytest.raises(TypeError):
        make_context().wrap(wrapper)  # type: ignore[type-var]


@pytest.mark.requirement("ERR-005")
def test_state_dict_of_another_layout(make_context: MakeContext, cell: Cell) -> None:
    """A state dict for another parameter layout raises ``ValueError``; the inner state is unchanged."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    before = copy.deepcopy(wrapper.optimizer.state_dict())
    other = torch.optim.Adam(list(make_model().parameters())[:2], lr=0.1)
    with pytest.raises(ValueError):
        wrapper.load_state_dict(other.state_dict())
    after = wrapper.optimizer.state_dict()
    assert after["param_groups"] == before["param_groups"], "param_groups changed by a refused load"
    for index, entry in before["state"].items():
        for key, value in entry.items():
            assert torch.equal(after["state"][index][key], value), f"state[{index}][{key!r}] changed by a refused load"
