"""ERR-005 broken: a malformed optimizer state goes to torch's ``load_state_dict`` unchecked.

Every wrapper of the field forwards ``load_state_dict`` to the inner optimizer and lets torch validate it (Lightning's
``LightningOptimizer``, Accelerate's ``AcceleratedOptimizer``): torch refuses another layout with ``ValueError`` and
changes nothing, so the forwarding looks complete. A state without torch's keys gets ``KeyError('param_groups')``,
and one that is not a dict an ``AttributeError`` from ``state_dict.copy()``: nothing changes, but nothing tells the
user what is wrong or what to load instead.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "ERR-005",
    [  # not "a list": torch's own error for it is a TypeError (list indices), which the contract asks for
        "test_a_malformed_optimizer_state_is_refused[{}]",
        "test_a_malformed_optimizer_state_is_refused[a state without 'param_groups']",
        "test_a_malformed_optimizer_state_is_refused[a state without 'state']",
        "test_a_malformed_optimizer_state_is_refused[a dict of other keys]",
        "test_a_malformed_optimizer_state_is_refused[None]",
    ],
)


class ForwardingWrapper(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)  # the defect: torch's own errors for a malformed state


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(ForwardingWrapper, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "ERR-005: a malformed optimizer state is left to torch's errors")
