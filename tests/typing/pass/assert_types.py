"""What mypy infers for the protocol's members, and for the reference's wrappers."""

from __future__ import annotations

import torch
from typing_extensions import assert_type

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import OptimizerWrapper, StepOutcome


def protocol_types(opt: OptimizerWrapper[torch.optim.Adam], loss: torch.Tensor) -> None:
    assert_type(opt.step(), None)
    assert_type(opt.step(make_optimizer_step=True), None)
    assert_type(opt.step(lambda: 1.5), float)

    def closure() -> torch.Tensor:
        opt.backward(loss)
        return loss

    assert_type(opt.step(closure), torch.Tensor)
    assert_type(opt.step(closure=closure, make_optimizer_step=False), torch.Tensor)
    assert_type(opt.step(closure, make_optimizer_step=None), torch.Tensor)
    assert_type(opt.step(closure, True, foo=1), torch.Tensor)
    assert_type(opt.optimizer, torch.optim.Adam)
    assert_type(opt.last_outcome, StepOutcome | None)
    assert_type(opt.backward(loss), None)
    assert_type(opt.zero_grad(), None)


def covariance(opt: OptimizerWrapper[torch.optim.Adam]) -> OptimizerWrapper[torch.optim.Optimizer]:
    return opt


def reference_types(model: torch.nn.Module) -> None:
    ctx = TrainingContext(precision="32-true", device="cpu")
    sgd: OptimizerWrapper[torch.optim.SGD] = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    assert_type(sgd.optimizer, torch.optim.SGD)
    assert_type(ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1)).optimizer, torch.optim.SGD)
    assert_type(sgd.step(lambda: 2), int)
    assert_type(sgd.step(), None)
