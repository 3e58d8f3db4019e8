"""AMP-004 broken: a step with non-finite gradients is applied anyway.

The gradients are unscaled (so the scaler records the overflow and backs off) but the inner optimizer then steps
itself, not through ``scaler.step``, which is what skips: infinite gradients reach the parameters and the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        self._slots[index].optimizer.step(**kwargs)
        if self._scaler is not None:
            self._scaler._stepped_since_update = True
        self._device.after_step()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
