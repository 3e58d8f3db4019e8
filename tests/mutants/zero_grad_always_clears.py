"""ZERO-002 broken: Accelerate-style ``zero_grad`` that always clears, wiping an open accumulation window.

The ``zero_grad(); backward(); step()`` loop then steps on the last micro-batch alone.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class AlwaysClears(Accumulation):
    def zero_grad_clears(self, window: Window, set_to_none: bool) -> bool:
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = AlwaysClears(self.parts.accumulation.every)

    @property
    def accumulate_grad_batches(self) -> int:
        return self.parts.accumulation.every

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        every = Accumulation(value).every  # the reference's setter, keeping this accumulation rule
        if every != self.parts.accumulation.every:
            self.parts.refusals.check_accumulation_change(self, every)
            self.parts.accumulation = AlwaysClears(every)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
