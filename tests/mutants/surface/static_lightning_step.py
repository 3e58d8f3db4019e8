"""SURFACE-001 broken (statically): the wrapper's ``step`` has Lightning's ``step(closure=None, **kwargs)``.

``make_optimizer_step`` still works as a keyword (it arrives in ``**kwargs``), so the run-time surface check
passes; but it cannot be passed positionally, and ``context.wrap`` is typed to return this wrapper, so mypy
rejects it as an ``OptimizerWrapper``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("SURFACE-001", ["test_static_surface"])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Wrapper(WrappedOptimizer[OptimizerT]):
    @override
    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:  # type: ignore[override]
        make_optimizer_step = kwargs.pop("make_optimizer_step", None)
        return super().step(closure, make_optimizer_step, **kwargs)


class Context(MutantContext):
    @override
    def wrap(self, optimizer: OptimizerT) -> Wrapper[OptimizerT]:
        return cast(Wrapper[OptimizerT], super().wrap(optimizer))

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:  # type: ignore[type-var]  # the defect: not a TrainingContext
    return mutant_info(Context, __name__)
