"""AMP-004 broken: a step skipped for non-finite gradients is still counted by the inner optimizer.

On an overflow the gradients are zeroed and the inner optimizer steps on them, as loss scalers that "skip" by
zeroing do: the outcome says skipped, but Adam counts the step, decays its moments and moves the parameters
(and SGD's momentum moves them too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        super()._inner_step(index, closure, kwargs)
        slot = self._slots[index]
        if slot.skipped:
            slot.optimizer.zero_grad(set_to_none=False)
            slot.optimizer.step(**kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
