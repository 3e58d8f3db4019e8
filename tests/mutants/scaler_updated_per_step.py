"""AMP-003 broken: ``scaler.update()`` runs after every optimizer step, not once per training iteration.

Accelerate's and Fabric's ``optimizer.step()``: ``scaler.step(optimizer)`` then ``scaler.update()``. Another
optimizer's overflow changes the scale in the middle of the iteration, and a window still open over that change
mixes gradients scaled by the old and the new scale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        super()._inner_step(index, closure, kwargs)
        if self._scaler is not None and self._scaler._stepped_since_update:
            self._scaler._stepped_since_update = False
            self._scaler.scaler.update()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
