"""PROXY-004 broken: a fused optimizer's skipped step still runs its inner ``step``, so its step hooks fire.

As a precision plugin that hands every real step to ``scaler.step(optimizer)`` (Lightning's ``MixedPrecision``,
a plain ``GradScaler`` loop): ``GradScaler`` calls a fused optimizer's ``step`` even when the gradients are not
finite, passing ``found_inf`` for its kernel to skip the update inside, and ``Optimizer.step``'s hooks run around
it. The step is reported as skipped, and the parameters stay as they were; only the hooks say it was taken.
Non-fused optimizers are unaffected: ``GradScaler`` does not call their ``step`` on an overflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        scaler = self.scaler
        fused = torch_compat.steps_through_inf(slot.optimizer)
        if scaler is None or closure is not None or not fused or not slot.has_gradients():
            return super()._inner_step(index, closure, kwargs)
        scaler.step(slot.optimizer, **kwargs)
        self._scaling._stepped_since_update = True  # type: ignore[attr-defined]
        slot.skipped = torch_compat.found_inf(scaler, slot.optimizer)
        self._device.after_step()
        return None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
