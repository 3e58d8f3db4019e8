"""ERR-005 broken: the wrapper's ``load_state_dict`` turns a layout mismatch into a warning (``strict=False``).

Resuming from the wrong checkpoint then trains on with fresh optimizer state and no error.
"""

from __future__ import annotations

import warnings
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("ERR-005", ["test_state_dict_of_another_layout"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        try:
            self.optimizer.load_state_dict(state_dict)
        except ValueError as exc:
            warnings.warn(f"optimizer state not loaded: {exc}", stacklevel=2)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
