"""ERR-007 broken: ``add_param_group`` adds the group first and checks its parameters afterwards.

A refused group is already in the inner optimizer's ``param_groups`` when the ``ValueError`` comes: the caller
sees an error, but the optimizer steps the bad parameter from then on.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F64, Mutant

MUTANT = Mutant("ERR-007", ["test_parameters_off_the_context_device_or_dtype"], cells=F64)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        context, optimizer = self.training_context, self.optimizer
        optimizer.add_param_group(param_group)
        for param in optimizer.param_groups[-1]["params"]:
            context.parts.refusals.check_parameter(context, param)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
