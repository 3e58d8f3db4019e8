"""STEP-006 broken: a real 16-mixed step returns what ``GradScaler.step`` returned, not the closure's result.

Lightning's precision plugin pattern: ``closure_result = closure(); ...; return scaler.step(optimizer, **kwargs)``.
``GradScaler.step`` returns the inner step's return value (``None`` for SGD without a closure), so the user's
closure result is lost on every real step under 16-mixed; accumulating steps and the other precisions are right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.reference.context import _has_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _scaler_result: tuple[Any] | None = None

    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        self._scaler_result = None
        result = super()._step(index, closure, make_optimizer_step, kwargs)
        captured = self._take_scaler_result()
        if captured is not None:
            returned: T | None = captured[0]
            return returned
        return result

    def _take_scaler_result(self) -> tuple[Any] | None:
        captured, self._scaler_result = self._scaler_result, None
        return captured

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        slot = self._slots[index]
        if self._scaler is None or not _has_gradients(slot):
            super()._inner_step(index, closure, kwargs)
            return
        self._scaler._stepped_since_update = True
        returned = self._scaler.scaler.step(slot.optimizer, **kwargs)
        found_inf = self._scaler.scaler._per_optimizer_states[id(slot.optimizer)]["found_inf_per_device"]
        slot.skipped = any(value.item() for value in found_inf.values())
        self._device.after_step()
        self._scaler_result = (returned,)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
