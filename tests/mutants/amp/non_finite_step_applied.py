"""AMP-004 broken: a step with non-finite gradients is applied anyway.

The gradients are unscaled (so the scaler records the overflow and backs off) but the inner optimizer then steps
itself, not through ``scaler.step``, which is what skips: infinite gradients reach the parameters and the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-004",
    ["test_overflow_in_one_optimizer_skips_only_that_one", "test_skipped_step_does_not_make_a_scheduler_warn"],
    cells=F16,
)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        scaling = self.parts.scaling
        if isinstance(scaling, GradScaling):
            scaling.stepped_since_update = True  # the scaler updates, but its found-inf is never read
        optimizer = window.optimizer
        result = optimizer.step(closure, **kwargs) if closure is not None else optimizer.step(**kwargs)
        self.parts.device.after_step()
        return True if closure is None else result  # never reported as skipped


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
