"""AMP-004 broken: a step skipped for non-finite gradients is still counted by the inner optimizer.

On an overflow the gradients are zeroed and the inner optimizer steps on them, as loss scalers that "skip" by
zeroing do: the outcome says skipped, but Adam counts the step, decays its moments and moves the parameters
(and SGD's momentum moves them too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("AMP-004", ["test_skipped_step_does_not_make_a_scheduler_warn", ORACLE_PROPERTY], cells=F16)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        taken = super().inner_step(window, kwargs, closure)
        if closure is None and not taken:
            window.optimizer.zero_grad(set_to_none=False)
            window.optimizer.step(**kwargs)
        return taken


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
