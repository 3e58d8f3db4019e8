"""TOGGLE-001 broken: a closure switches off the parameters the other optimizers held when they were wrapped.

The context keeps each optimizer's parameter list from ``wrap``; a group added later with ``add_param_group``
is never switched off in the other optimizers' closures, so their losses leak gradients into its window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.toggling import Toggling, only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("TOGGLE-001", ["test_toggling_follows_flags_and_groups_changed_after_wrap", ORACLE_PROPERTY])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class OthersAtWrap(Toggling):
    def __init__(self) -> None:
        self.params_at_wrap: list[list[torch.Tensor]] = []

    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        others = [p for i, params in enumerate(self.params_at_wrap) if i != index for p in params]
        with (
            only_these_require_grad(context.windows[index].params(), others),
            nullcontext() if sync_grad else context.parts.parallel.without_sync(),
        ):
            yield


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._at_wrap = OthersAtWrap()
        self.parts.toggling = self._at_wrap

    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        self._at_wrap.params_at_wrap.append(self.windows[-1].params())
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
