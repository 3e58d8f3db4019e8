"""ZERO-005 broken: an optimizer that evaluates its closure itself (LBFGS) carries its last step's gradients.

What its last evaluation left is taken by the next step and added to every evaluation's gradients, which CLOS-004
says start from none.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.preparation import AddCarried
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-005", ["test_an_optimizer_that_evaluates_its_closure_carries_nothing"])


class EvaluatorsLeaveToo(LeaveToUser):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        super().after_step(window, skipped=skipped)
        if window.evaluates_closure and not skipped:
            window.left = {
                param: (weakref.ref(param.grad), torch_compat.version_counter(param.grad))
                for param in window.params()
                if param.grad is not None
            } or None


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = EvaluatorsLeaveToo()
            evaluation = (AddCarried(), *self.parts.preparation.evaluation)
            self.parts.preparation = dataclasses.replace(self.parts.preparation, evaluation=evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
