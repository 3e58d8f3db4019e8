"""Checks that the wrapper is a transparent proxy of its inner optimizer."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch

from lightning_optimizer.conformance.harness import cell_device, cell_dtype, make_batches, make_model, mse, run_steps
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]


def _wrapped_adam(make_context: MakeContext, **kwargs: int) -> tuple[TrainingContext, torch.nn.Module, Any]:
    context = make_context(**kwargs)
    model = context.prepare_module(make_model())
    return context, model, context.wrap(torch.optim.Adam(model.parameters(), lr=0.01))


@pytest.mark.requirement("PROXY-001")
def test_isinstance_of_the_inner_class(make_context: MakeContext, cell: Cell) -> None:
    """The wrapper is an instance of the inner optimizer's class and of ``torch.optim.Optimizer``."""
    _, _, wrapper = _wrapped_adam(make_context)
    assert isinstance(wrapper, torch.optim.Adam), f"{type(wrapper).__name__} is not a torch.optim.Adam"
    assert isinstance(wrapper, torch.optim.Optimizer), f"{type(wrapper).__name__} is not a torch.optim.Optimizer"


@pytest.mark.requirement("PROXY-002")
def test_proxied_objects_are_the_inner_ones(make_context: MakeContext, cell: Cell) -> None:
    """``optimizer``, ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's own objects."""
    context, model, wrapper = _wrapped_adam(make_context)
    inner = wrapper.optimizer
    assert type(inner) is torch.optim.Adam, f"wrapper.optimizer is a {type(inner).__name__}, not the Adam"
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    assert wrapper.param_groups is inner.param_groups, "param_groups is a copy"
    assert wrapper.state is inner.state, "state is a copy"
    assert wrapper.defaults is inner.defaults, "defaults is a copy"
    assert len(inner.state) == len(list(model.parameters())), "the inner optimizer has no state after a step"


@pytest.mark.requirement("PROXY-003")
def test_writes_reach_the_inner_optimizer(make_context: MakeContext, cell: Cell) -> None:
    """``load_state_dict``, ``add_param_group`` and attribute assignment change the inner optimizer."""
    context, model, wrapper = _wrapped_adam(make_context)
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    saved = copy.deepcopy(wrapper.optimizer.state_dict())  # the live dict's tensors change in place
    run_steps(context, model, wrapper, make_batches(1, seed=5), cell, lambda i: True)
    wrapper.load_state_dict(saved)
    step = wrapper.optimizer.state_dict()["state"][0]["step"]
    assert float(step) == 1.0, f"load_state_dict did not reach the inner optimizer (its step count is {float(step)})"
    extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(cell), dtype=cell_dtype(cell)))
    wrapper.add_param_group({"params": [extra], "lr": 0.5})
    assert len(wrapper.optimizer.param_groups) == 2, "add_param_group did not reach the inner optimizer"
    assert wrapper.optimizer.param_groups[1]["params"][0] is extra
    wrapper.custom_flag = "set through the wrapper"
    assert getattr(wrapper.optimizer, "custom_flag", None) == "set through the wrapper", (
        "attribute assignment on the wrapper did not reach the inner optimizer"
    )


@pytest.mark.requirement("PROXY-004")
def test_step_hooks_fire_on_real_steps(make_context: MakeContext, cell: Cell) -> None:
    """Step hooks registered through the wrapper fire once per step taken, never on accumulation or a skip."""
    context, model, wrapper = _wrapped_adam(make_context, accumulate_grad_batches=2)
    fired: list[str] = []
    wrapper.register_step_pre_hook(lambda optimizer, args, kwargs: fired.append("pre"))
    wrapper.register_step_post_hook(lambda optimizer, args, kwargs: fired.append("post"))
    outcomes = run_steps(context, model, wrapper, make_batches(6), cell)
    taken = outcomes.count(StepOutcome.STEPPED)
    assert taken > 0, f"no window stepped: {outcomes}"
    assert fired == ["pre", "post"] * taken, f"hooks fired as {fired} for outcomes {outcomes}"


@pytest.mark.requirement("PROXY-005")
def test_repr_names_the_inner_optimizer(make_context: MakeContext, cell: Cell) -> None:
    """``repr`` of the wrapper names the class of what it wraps."""
    _, _, wrapper = _wrapped_adam(make_context)
    assert "Adam" in repr(wrapper), f"repr does not say it wraps an Adam: {wrapper!r}"


@pytest.mark.requirement("SCHED-001")
@pytest.mark.features("lr_schedulers")
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
def test_scheduler_follows_real_steps_without_warnings(make_context: MakeContext, cell: Cell, built_on: str) -> None:
    """A scheduler on the wrapper or the inner optimizer, stepped after each real step, warns nothing."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=1.0))
    # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
    target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
        for batch_idx, batch in enumerate(batches):
            with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

                def closure(batch: Any = batch) -> torch.Tensor:
                    with context.autocast():
                        loss = mse(model, batch, device, dtype)
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)
                if batch_idx % 2 == 1:
                    scheduler.step()
    assert wrapper.param_groups[0]["lr"] == pytest.approx(0.125), "three real steps should halve the lr three times"
