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

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


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
