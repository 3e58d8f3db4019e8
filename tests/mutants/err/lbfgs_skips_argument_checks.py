"""ERR-002 broken: the LBFGS path returns before the argument checks (ERR-001 and ERR-002).

Like a wrapper with an early ``if isinstance(optimizer, LBFGS): return optimizer.step(closure)``: a
``make_optimizer_step`` that is not a bool is read as a truth value (``"yes"`` steps, ``0`` is refused as
accumulation with a ``ValueError``), and a non-callable closure reaches LBFGS, whose step starts before it fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext as ReferenceContext
from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-002", ["test_lbfgs_step_refuses_bad_arguments"])


class LbfgsFirstRefusals(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        if not window.evaluates_closure:
            super().check_step(context, window, closure, make_optimizer_step, kwargs)


class TruthyAccumulation(Accumulation):
    __slots__ = ()

    @override
    def closes(self, make_optimizer_step: object, pending: int, position: LoopPosition | None) -> bool:
        if make_optimizer_step is not None and not isinstance(make_optimizer_step, bool):
            return bool(make_optimizer_step)  # unchecked (only LBFGS's are): read as a truth value
        return super().closes(make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = LbfgsFirstRefusals()
        self.parts.accumulation = TruthyAccumulation(self.parts.accumulation.accumulate_grad_batches)

    @property  # type: ignore[explicit-override]  # mypy misses @override on a property with a setter
    @override
    def accumulate_grad_batches(self) -> int:
        return self.parts.accumulation.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        reference: property = vars(ReferenceContext)["accumulate_grad_batches"]
        reference.__set__(self, value)  # the reference's checks, then its rebuild of the accumulation rule
        self.parts.accumulation = TruthyAccumulation(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
