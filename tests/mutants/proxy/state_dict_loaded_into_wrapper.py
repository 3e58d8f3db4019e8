"""PROXY-003 broken: ``load_state_dict`` loads into the wrapper itself and leaves the inner optimizer untouched.

As Lightning 2.x's ``LightningOptimizer``, which inherits ``torch.optim.Optimizer.load_state_dict``: the loaded
state lands in the wrapper's own ``__dict__`` while the inner optimizer, which does the stepping, keeps its old
state, so a resumed run silently restarts its optimizer state.
"""

from __future__ import annotations

import copy
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import RESUME_PROPERTY, Mutant

MUTANT = Mutant("PROXY-003", ["test_writes_reach_the_inner_optimizer", RESUME_PROPERTY])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        vars(self)["_loaded_state_dict"] = copy.deepcopy(state_dict)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
