"""ERR-007 broken: ``add_param_group`` forwards to the inner optimizer without checking the parameters.

``wrap`` refuses parameters off the context's device or dtype, but a group added later goes straight to the inner
optimizer (Lightning's and Fabric's wrappers forward ``add_param_group`` untouched): a float32 parameter joins a
64-true model's optimizer, a CPU one an XLA model's.
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
        self.optimizer.add_param_group(param_group)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
