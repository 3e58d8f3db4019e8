"""A framework author's record for the suite: a context class and a factory function, both precisely typed."""

from __future__ import annotations

from typing import Literal, assert_type

from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import Cell, FailurePolicy, GradScalerSettings, ImplementationInfo, implementation_info


class CellContext(TrainingContext):
    """A context class whose constructor takes the suite's call: the class itself is the factory."""

    def __init__(
        self,
        cell: Cell,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> None:
        scaler = None if grad_scaler is None else GradScaler(cell.device, **grad_scaler.as_kwargs())
        super().__init__(
            cell.precision,
            cell.device,
            accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            scaler=scaler,
            on_failure=on_failure,
            zero_grad_after_step=zero_grad_after_step,
        )


def make_context(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> TrainingContext:
    return CellContext(
        cell,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        grad_scaler=grad_scaler,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def from_class() -> ImplementationInfo[CellContext]:
    info = implementation_info(CellContext, name="cells", version="1.0", precisions={"32-true", "bf16-mixed"})
    assert_type(info, ImplementationInfo[CellContext])
    return info


def from_function() -> ImplementationInfo[TrainingContext]:
    info = implementation_info(make_context, name="made", version="1.0", devices=("cpu", "cuda"), world_sizes={1, 2})
    assert_type(info.factory(Cell("cpu", "32-true"), gradient_clip_val=1.0), TrainingContext)
    assert_type(info.factory(Cell("cpu", "32-true"), on_failure="restore").on_failure, FailurePolicy)
    return info
