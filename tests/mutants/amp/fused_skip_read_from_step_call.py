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

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "AMP-004",
    [
        "test_skip_with_fused_and_foreach_adam[fused-1]",
        "test_skip_with_fused_and_foreach_adam[fused-3]",
        "test_skipped_fused_step_does_not_make_a_scheduler_warn",
        ORACLE_PROPERTY,
    ],
    cells=F16,
)

_MISSING = object()


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if self.scaler is None or closure is not None or not window.has_gradients():
            return super().inner_step(window, kwargs, closure)
        optimizer = window.optimizer
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
        self.parts.device.after_step()
        return bool(called)  # skipped: the inner step was not called


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
