"""SCHED-001 broken: the LR scheduler's patch of ``wrapper.step`` is forwarded to the inner optimizer.

A proxy whose ``__setattr__`` forwards every name: the scheduler's counting ``step`` lands on the inner optimizer
and calls back into the wrapper, so a scheduler built on the wrapper breaks the step.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "SCHED-001",
    [
        "test_scheduler_follows_real_steps_without_warnings[wrapper]",
        "test_scheduler_warns_after_accumulating_calls_as_torch_does[wrapper]",
    ],
)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "step":
            setattr(self.optimizer, name, value)
        else:
            super().__setattr__(name, value)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
