"""AMP-004 broken: a skipped step is detected by whether the inner optimizer's ``step`` was called.

Accelerate's pattern: ``optimizer.step`` is patched to set ``_accelerate_step_called``, and after
``scaler.step(optimizer)`` a step that was not called counts as skipped. ``GradScaler`` calls a fused optimizer's
``step`` even when the gradients are not finite (the fused kernel skips inside, given ``found_inf``), so with
``Adam(fused=True)`` an overflow is reported as ``STEPPED`` and counted as a step. Non-fused optimizers are
unaffected: ``GradScaler`` does not call their ``step`` at all when it skips.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

_MISSING = object()


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        if self.scaler is None or closure is not None or not slot.has_gradients():
            return super()._inner_step(index, closure, kwargs)
        optimizer = slot.optimizer
        called: list[bool] = []
        saved = optimizer.__dict__.get("step", _MISSING)
        original: Callable[..., Any] = optimizer.step

        def patched(*args: Any, **step_kwargs: Any) -> Any:
            called.append(True)
            return original(*args, **step_kwargs)

        optimizer.step = patched  # type: ignore[method-assign]
        try:
            self.scaler.step(optimizer, **kwargs)
        finally:
            if saved is _MISSING:
                del optimizer.step
            else:
                optimizer.step = saved  # type: ignore[method-assign]
        slot.skipped = not called
        self._device.after_step()
        return None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
