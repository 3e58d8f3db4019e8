"""TOGGLE-001 broken: a closure switches off the parameters of one other optimizer only, the next one.

Right for two optimizers, as in a GAN; with three, the parameters of the third keep ``requires_grad=True`` in
the closure, so its loss leaks gradients into that optimizer's window. Only schedules with three optimizers
show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling, only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("TOGGLE-001", [ORACLE_PROPERTY])


class NextOneOnly(Toggling):
    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        windows = context.windows
        own = windows[index].params()
        following = windows[(index + 1) % len(windows)]
        others = [] if len(windows) == 1 else following.params()
        with (
            only_these_require_grad(own, others),
            nullcontext() if sync_grad else context.parts.parallel.without_sync(),
        ):
            yield


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = NextOneOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
