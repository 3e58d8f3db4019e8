"""STEP-006 broken: an optimizer that evaluates its closure gets (and ``step()`` returns) each loss detached.

The pattern of a wrapper that detaches what the inner optimizer's evaluations return, so that the optimizer
cannot keep the graph alive: the value is the same, but ``step()`` no longer returns the closure's own result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-006", ["test_an_evaluating_optimizer_step_returns_its_first_evaluation"])

T = TypeVar("T")


class _Detaching(Closures):
    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        loss: Any = super().evaluate(context, call, index, closure)
        return loss.detach() if isinstance(loss, torch.Tensor) else loss  # type: ignore[return-value]


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = _Detaching()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
