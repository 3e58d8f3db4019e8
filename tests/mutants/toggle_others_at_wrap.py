"""TOGGLE-001 broken: a closure switches off the parameters the other optimizers held when they were wrapped.

The context keeps each optimizer's parameter list from ``wrap``; a group added later with ``add_param_group``
is never switched off in the other optimizers' closures, so their losses leak gradients into its window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.distributed import no_sync
from lightning_optimizer.reference.toggling import only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._params_at_wrap: list[list[torch.Tensor]] = []

    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        self._params_at_wrap.append(self._slots[-1].params())
        return wrapper

    @contextmanager
    def _toggle(self, index: int, *, sync_grad: bool) -> Iterator[None]:
        others = [p for i, params in enumerate(self._params_at_wrap) if i != index for p in params]
        with (
            only_these_require_grad(self._slots[index].params(), others),
            no_sync(self._modules if not sync_grad else ()),
        ):
            yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
