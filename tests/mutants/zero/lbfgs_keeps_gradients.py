"""ZERO-001 broken: after an LBFGS step its parameters keep the gradients of the last evaluation.

The first-order path zeroes after its real step; the closure-evaluating path leaves the zeroing to the user's
closure (which zeroes at its start), so the last evaluation's gradients stay on the parameters after ``step``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import ClearAfterStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-001", ["test_lbfgs_beside_another_optimizer"])


class KeepsEvaluationGradients(ClearAfterStep):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        kept = [(param, param.grad) for param in window.params()] if window.evaluates_closure else []
        super().after_step(window, skipped=skipped)
        for param, grad in kept:
            param.grad = grad


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.zeroing.clears_after_step:  # the default setting's rule (ZERO-001); False is left as it is
            self.parts.zeroing = KeepsEvaluationGradients()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
