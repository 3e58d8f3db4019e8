"""PROXY-003 broken: ``add_param_group`` on the wrapper forwards the group's parameters only.

As a wrapper that rebuilds the group as ``{"params": ...}`` before handing it on: the inner optimizer fills in its
defaults, so the new group's own ``lr``, ``momentum`` or ``weight_decay`` is lost.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("PROXY-003", ["test_added_group_keeps_its_hyper_parameters", ORACLE_PROPERTY])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group({"params": param_group["params"]})


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
