"""HOOK-004 broken: ``before_optimizer_step`` runs after the inner step, outside the call's transaction.

The hook still sees the gradients the step applied, but one that raises leaves the step taken: parameters moved,
the window closed, while the call raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    _pending_hook: tuple[int, Any] | None = None

    def _before_optimizer_step(self, index: int, wrapper: Any) -> None:
        self._pending_hook = (index, wrapper)

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        result = super()._inner_step(index, closure, kwargs)
        pending, self._pending_hook = self._pending_hook, None
        if pending is not None and self._hooks.before_optimizer_step:
            slot_index, wrapper = pending
            call, self._call = self._call, None  # the step is taken: nothing of this call is undone now
            try:
                self._hooks.run_before_optimizer_step(wrapper or self._new_wrapper(slot_index))
            finally:
                self._call = call
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
