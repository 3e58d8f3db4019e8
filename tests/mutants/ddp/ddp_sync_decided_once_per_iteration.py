"""DDP-001 broken: one sync decision per training iteration, taken by its first ``step()``, for every wrapper.

Like a framework that keeps a single global ``sync_gradients`` flag for all models and optimizers (Accelerate's
``GradientState``): right with one optimizer, but when two optimizers of one iteration have different cadences,
the second's closure runs under the first one's decision. A real step of the second then applies each rank's
unreduced gradients (or a window it keeps open all-reduces in vain).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, RANK_PROPERTY, Mutant

MUTANT = Mutant("DDP-001", ["test_closure_form_syncs_each_module_once_per_window", RANK_PROPERTY], cells=DDP)

T = TypeVar("T")


class Context(MutantContext):
    _iteration: tuple[object, bool] | None = None
    """The iteration's loop position (``None`` outside ``batch()``) and the sync decision its first step took."""

    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        if self._iteration is None or self._iteration[0] is not self.windows.position:
            self._iteration = (self.windows.position, call.real)  # the first step() of the iteration decides
        parts = self.parts
        watch: AbstractContextManager[None] = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window))
            if parts.scaling.changes_gradients
            else nullcontext()
        )
        with parts.toggling.region(self, index, sync_grad=self._iteration[1]), watch, self.autocast():
            return closure()

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        result = super().inner_step(window, kwargs, closure)
        if self.windows.position is None:
            self._iteration = None  # outside batch() each real step ends the iteration
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
