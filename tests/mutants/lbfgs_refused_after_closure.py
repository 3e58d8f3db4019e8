"""AMP-005 broken: LBFGS under 16-mixed is refused only after its closure ran.

The check sits in the step, after the first evaluation (as where the precision plugin only looks at the
closure's result): the ``TypeError`` comes, but the user's forward and backward pass already ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import mutant_info
from mutants.lbfgs_accepted_under_16_mixed import Context as AcceptsLbfgs

T = TypeVar("T")


class Context(AcceptsLbfgs):
    """Wraps LBFGS under 16-mixed as the accepting mutant does, then refuses it in the step."""

    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        loss = super()._evaluate_closure(index, closure)
        if self.scaler is not None:
            name = type(self._slots[index].optimizer).__name__
            raise TypeError(f"{name} evaluates its closure itself, which loss scaling cannot follow")
        return loss


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
