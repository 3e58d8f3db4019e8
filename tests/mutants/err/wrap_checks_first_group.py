"""ERR-007 broken: ``wrap`` checks only the parameters of the optimizer's first parameter group.

The device and dtype are checked on ``optimizer.param_groups[0]``, as code that infers "the optimizer's device" from
its first group does: a second group with a float32 parameter in 64-true, or a CPU one, is accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-007", ["test_parameters_off_the_context_device_or_dtype"], cells=F64)


class FirstGroupRefusals(Refusals):
    _checked: set[int] | None = None

    @override
    def check_wrap(self, context: TrainingContext, optimizer: object) -> None:
        groups = getattr(optimizer, "param_groups", None)
        self._checked = {id(p) for p in groups[0]["params"]} if isinstance(groups, list) and groups else None
        try:
            super().check_wrap(context, optimizer)
        finally:
            self._checked = None

    @override
    def check_parameter(self, context: TrainingContext, param: torch.Tensor) -> None:
        if self._checked is None or id(param) in self._checked:
            super().check_parameter(context, param)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = FirstGroupRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
