"""XLA-001 broken: the real step reduces the gradients before its closure runs the window's last backward.

Lightning 1.1 on TPUs: ``xm.optimizer_step(optimizer, optimizer_args={"closure": closure})`` reduces first and
only then steps, which runs the closure: the last micro-batch's gradients are never reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.preparation import Preparation, Reduction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant("XLA-001", ["test_one_reduction_per_window_after_its_last_backward"], cells=XLA)

T = TypeVar("T")


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        # Reduced in run_closure instead.
        self.parts.preparation = Preparation(
            steps=tuple(step for step in preparation.steps if not isinstance(step, Reduction)),
            evaluation=tuple(step for step in preparation.evaluation if not isinstance(step, Reduction)),
        )

    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        if call.real:
            self.parts.device.reduce_gradients(call.window.optimizer)
        return super().run_closure(call, index, closure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
