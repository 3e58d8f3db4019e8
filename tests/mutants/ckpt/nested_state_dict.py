"""CKPT-001 broken: the wrapper's ``state_dict`` nests the inner optimizer's in an envelope of its own.

It loads back into the same wrapper, but is not the format that ``torch.optim`` tooling expects.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("CKPT-001", ["test_state_dict_is_the_inner_format"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "wrapper": {"precision": self.training_context.precision}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
