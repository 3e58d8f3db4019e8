"""AMP-003 broken: ``scaler.update()`` runs after every optimizer step, not once per training iteration.

Accelerate's and Fabric's ``optimizer.step()``: ``scaler.step(optimizer)`` then ``scaler.update()``. Another
optimizer's overflow changes the scale in the middle of the iteration, and a window still open over that change
mixes gradients scaled by the old and the new scale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "AMP-003",
    ["test_open_window_survives_a_scale_change", "test_overflow_in_one_optimizer_skips_only_that_one", ORACLE_PROPERTY],
    cells=F16,
)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        result = super().inner_step(window, kwargs, closure)
        scaling = self.parts.scaling
        if isinstance(scaling, GradScaling) and scaling.stepped_since_update:
            scaling.stepped_since_update = False
            scaling.scaler.update()
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
