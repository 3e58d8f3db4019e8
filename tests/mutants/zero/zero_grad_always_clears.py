"""ZERO-002 broken: Accelerate-style ``zero_grad`` that always clears, wiping an open accumulation window.

The ``zero_grad(); backward(); step()`` loop then steps on the last micro-batch alone.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ZERO-002", ["test_zero_grad_keeps_an_open_window", ORACLE_PROPERTY])


class AlwaysClears(Accumulation):
    @override
    def zero_grad_clears(self, window: Window) -> bool:
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = AlwaysClears(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
