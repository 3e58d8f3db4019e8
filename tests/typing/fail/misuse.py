"""Misuses that mypy --strict must reject: one per line, each silenced by exactly the error code it raises.

Checked by tests/test_typing.py with --warn-unused-ignores: a misuse that stops erroring leaves an unused
ignore, a misuse that errors with another code is not covered by its ignore, and stripping the ignores must
make mypy report exactly the named codes on exactly these lines. Lines without an ignore must stay clean.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import Cell, OptimizerWrapper, StepOutcome, implementation_info


class NoBackward:
    """Every member of OptimizerWrapper[SGD] except ``backward``."""

    def __init__(self, optimizer: torch.optim.SGD) -> None:
        self._optimizer = optimizer

    @property
    def optimizer(self) -> torch.optim.SGD:
        return self._optimizer

    @property
    def last_outcome(self) -> StepOutcome | None:
        return None

    def step(
        self, closure: Callable[[], Any] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> Any:
        return None if closure is None else closure()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none)

    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        return nullcontext()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._optimizer.param_groups

    @property
    def state(self) -> Any:
        return self._optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:
        return self._optimizer.defaults

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def unscale_gradients(self) -> None:
        pass

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._optimizer.add_param_group(param_group)


def misuse(opt: OptimizerWrapper[torch.optim.SGD], loss: torch.Tensor, no_backward: NoBackward) -> None:
    def closure() -> torch.Tensor:
        opt.backward(loss)
        return loss

    def takes_arg(x: torch.Tensor) -> torch.Tensor:
        return x

    opt.step(closure=closure, make_optimizer_step="yes")  # type: ignore[call-overload]
    opt.step(closure=closure, make_optimizer_step=1)  # type: ignore[call-overload]
    opt.step(closure=3)  # type: ignore[call-overload]
    opt.step(lambda x: x)  # type: ignore[arg-type, misc]
    opt.step(takes_arg)  # type: ignore[arg-type]
    opt.backward()  # type: ignore[call-arg]
    opt.stepp()  # type: ignore[attr-defined]
    wrapper: OptimizerWrapper[torch.optim.SGD] = no_backward  # type: ignore[assignment]
    del wrapper


def no_clipping(cell: Cell, *, accumulate_grad_batches: int = 1) -> TrainingContext:
    """A factory that cannot take the suite's clipping and loss-scaler arguments."""
    return TrainingContext(cell.precision, cell.device, accumulate_grad_batches)


def misdescribed() -> None:
    implementation_info(no_clipping, name="x", version="1")  # type: ignore[arg-type]
    implementation_info(TrainingContext, name="x", version="1")  # type: ignore[arg-type]
    implementation_info(TrainingContext, name="x", version="1", devices="cpu")  # type: ignore[arg-type]


def misregistered(context: TrainingContext) -> None:
    context.register_hooks(after_step=lambda wrapper: None)  # type: ignore[arg-type, misc]
    context.register_hooks(before_backward=3)  # type: ignore[arg-type]
    context.register_hooks(lambda wrapper, loss: None)  # type: ignore[call-arg]


def misconfigured_standalone() -> None:
    """The twin package for ``pytorch_lightning`` is typed, not ``Any``: its misuse is caught as the other's is."""
    from lightning_optimizer.reference.pytorch_lightning import ReferenceDDPStrategy, ReferenceSingleDeviceStrategy

    ReferenceSingleDeviceStrategy(grad_scaler=3)  # type: ignore[arg-type]
    ReferenceSingleDeviceStrategy("cpu", None)  # type: ignore[call-arg]
    ReferenceDDPStrategy().reference_contxt  # type: ignore[attr-defined]
