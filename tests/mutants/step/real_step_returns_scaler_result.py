"""STEP-006 broken: a real 16-mixed step returns what ``GradScaler.step`` returned, not the closure's result.

Lightning's precision plugin pattern: ``closure_result = closure(); ...; return scaler.step(optimizer, **kwargs)``.
``GradScaler.step`` returns the inner step's return value (``None`` for SGD without a closure), so the user's
closure result is lost on every real step under 16-mixed; accumulating steps and the other precisions are right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "STEP-006",
    ["test_kwargs_and_result_with_gradients", "test_step_returns_the_closure_result_whatever_the_inner_returns"],
    cells=F16,
)

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        context = self.training_context
        assert isinstance(context, Context)
        context.take_scaler_result()
        result = super().step(closure, make_optimizer_step, **kwargs)
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

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if self.scaler is None or closure is not None or not window.has_gradients():
            return super().inner_step(window, kwargs, closure)
        captured: list[Any] = []

        def step(**step_kwargs: Any) -> Any:
            captured.append(window.optimizer.step(**step_kwargs))
            return captured[-1]

        taken = self.parts.scaling.step(window.optimizer, step, kwargs)
        self.parts.device.after_step()
        self.scaler_result = (captured[0] if captured else None,)  # GradScaler.step's return: the inner step's
        return taken

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
