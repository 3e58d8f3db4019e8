"""TOGGLE-001 broken: no ``requires_grad`` toggling; a closure's backward also fills other optimizers' ``.grad``.

In a GAN the generator's loss then leaves gradients on the discriminator that its next step applies.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "TOGGLE-001",
    ["test_closure_sees_only_its_parameters", "test_toggle_model_block", "test_gan_cadences", ORACLE_PROPERTY],
)


class NoToggling(Toggling):
    @override
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        return nullcontext() if sync_grad else context.parts.parallel.without_sync()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = NoToggling()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
