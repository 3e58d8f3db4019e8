"""STEP-006 broken: a real 16-mixed step returns what ``GradScaler.step`` returned, not the closure's result.

Lightning's precision plugin pattern: ``closure_result = closure(); ...; return scaler.step(optimizer, **kwargs)``.
``GradScaler.step`` returns the inner step's return value (``None`` for SGD without a closure), so the user's
closure result is lost on every real step under 16-mixed; accumulating steps and the other precisions are right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        context = self._context
        assert isinstance(context, Context)
        context.take_scaler_result()
        result = context._step(self._index, closure, make_optimizer_step, kwargs)
        captured = context.take_scaler_result()
        if captured is not None:
            returned: T | None = captured[0]
            return returned
        return result


class Context(MutantContext):
    scaler_result: tuple[Any] | None = None

    def take_scaler_result(self) -> tuple[Any] | None:
        captured, self.scaler_result = self.scaler_result, None
        return captured

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        scaler = self.scaler
        if scaler is None or closure is not None or not slot.has_gradients():
            return super()._inner_step(index, closure, kwargs)
        captured: list[Any] = []

        def step(**step_kwargs: Any) -> Any:
            captured.append(slot.optimizer.step(**step_kwargs))
            return captured[-1]

        slot.skipped = not self._scaling.step(slot.optimizer, step, kwargs)
        self._device.after_step()
        self.scaler_result = (captured[0] if captured else None,)  # GradScaler.step's return: the inner step's
        return None

    def _new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self._slots[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
