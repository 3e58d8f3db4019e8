"""AMP-008 broken, half-fixed: an unscaled backward is refused in a closing step's closure only.

A framework that checks the gradients where it unscales them, at the real step: a micro-step's unscaled gradients
are accumulated into the window without a word and divided by the loss scale later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if sync_grad and self._call is not None and self._call.real:
            return super()._run_closure(index, closure, sync_grad)
        with self._toggle(index, sync_grad=sync_grad), self.autocast():
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
