"""AMP-004 broken: a step with non-finite gradients is applied anyway.

The gradients are unscaled (so the scaler records the overflow and backs off) but the inner optimizer then steps
itself, not through ``scaler.step``, which is what skips: infinite gradients reach the parameters and the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        if isinstance(self._scaling, GradScaling):
            self._scaling._stepped_since_update = True  # the scaler updates, but its found-inf is never read
        result = slot.optimizer.step(closure, **kwargs) if closure is not None else slot.optimizer.step(**kwargs)
        self._device.after_step()
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
