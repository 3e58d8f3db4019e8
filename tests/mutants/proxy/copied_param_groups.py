"""PROXY-002 broken: ``param_groups`` and ``state`` are snapshots of the inner optimizer's, not its own objects.

Reads look right; code that keeps the list or mutates the mapping works on a copy.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-002", ["test_proxied_objects_are_the_inner_ones"])


class Wrapper(WrappedOptimizer[Any]):
    @property  # type: ignore[explicit-override]  # mypy misses @override on a property with a setter
    @override
    def param_groups(self) -> list[dict[str, Any]]:
        return list(self.optimizer.param_groups)

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property  # type: ignore[explicit-override]  # mypy misses @override on a property with a setter
    @override
    def state(self) -> Any:
        return dict(self.optimizer.state)

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
