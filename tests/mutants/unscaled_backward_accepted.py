"""AMP-008 broken: under 16-mixed a closure's plain ``loss.backward()`` is accepted.

The reference until contract 2026.12.5: the window holds unscaled gradients, which the real step divides by the
loss scale (65536 at first), and trains on a gradient that small with nothing said.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        with self._toggle(index, sync_grad=sync_grad), self.autocast():
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
