"""ZERO-001 broken: after a real step only the first parameter group's gradients are cleared.

The wrapper clears ``optimizer.param_groups[0]["params"]`` itself instead of calling the inner ``zero_grad``: a
second group keeps the stepped window's gradients, which then leak into the next window's sum.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import ClearAfterStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ZERO-001", [ORACLE_PROPERTY])


class ZeroFirstGroupOnly(ClearAfterStep):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        grads = [(param, param.grad) for group in window.optimizer.param_groups[1:] for param in group["params"]]
        super().after_step(window, skipped=skipped)
        for param, grad in grads:
            param.grad = grad


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.zeroing.clears_after_step:  # the default setting's rule (ZERO-001); False is left as it is
            self.parts.zeroing = ZeroFirstGroupOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
