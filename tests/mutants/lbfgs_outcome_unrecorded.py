"""STEP-004 broken: an LBFGS step does not record its outcome; ``last_outcome`` keeps what it was (``None``).

The closure-evaluating path returns LBFGS's result straight after its step and never sets the outcome that the
first-order path sets, so a user (or a framework's logging) reads ``None`` after every LBFGS step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _closure_evaluating_step(self, index: int, closure: Callable[[], T], kwargs: dict[str, Any]) -> T:
        slot = self._slots[index]
        before = slot.last_outcome
        result = super()._closure_evaluating_step(index, closure, kwargs)
        slot.last_outcome = before
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
