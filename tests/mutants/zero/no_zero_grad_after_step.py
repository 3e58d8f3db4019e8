"""ZERO-001 broken: a real step leaves the window's gradients in ``.grad`` (the user must call ``zero_grad``)."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import ClearAfterStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-001",
    ["test_real_step_clears_gradients", "test_a_taken_step_leaves_the_gradients_it_applied[zero-after-step]"],
)


class NoZeroGrad(ClearAfterStep):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        kept = [(param, param.grad) for param in window.params()]
        super().after_step(window, skipped=skipped)
        for param, grad in kept:  # the real step's zero_grad undone: the window's gradients stay
            param.grad = grad


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.zeroing.clears_after_step:  # the default setting's rule (ZERO-001); False is left as it is
            self.parts.zeroing = NoZeroGrad()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
