"""ERR-009 broken: ``toggle_model(sync_grad=...)`` is coerced with ``bool(...)`` instead of being type-checked.

``0``, ``None`` or an empty string suppresses DDP's gradient sync, any other object keeps it, without an error.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("ERR-009", ["test_non_bool_sync_grad_and_is_last"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        return super().toggle_model(bool(sync_grad))


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
