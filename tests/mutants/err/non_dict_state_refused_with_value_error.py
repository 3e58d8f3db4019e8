"""ERR-005 broken: an optimizer state that is not a ``dict`` raises ``ValueError``, not ``TypeError``.

The wrapper's ``load_state_dict`` refuses, before anything changes, a state that is not a dict and one that lacks
torch's keys, naming them; but it raises ``ValueError`` for both, reasoning that "a malformed state" is one kind of
error (the layout and CKPT-003's malformed context states are ``ValueError``). The contract separates them: the wrong
type is ``TypeError``.

Plausible: one ``ValueError("not an optimizer state")`` for every malformed input is the economical way to write it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import check_optimizer_state
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "ERR-005",
    ["test_a_malformed_optimizer_state_is_refused[None]", "test_a_malformed_optimizer_state_is_refused[a list]"],
    blind="batch 4",
)


class OneErrorForEveryMalformedState(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optimizer, given = self.optimizer, cast(object, state_dict)
        if type(optimizer).load_state_dict is torch.optim.Optimizer.load_state_dict and not isinstance(given, dict):
            name = type(optimizer).__name__
            raise ValueError(  # the defect: ValueError, where the contract says TypeError
                f"{name}.load_state_dict expects the dict that {name}.state_dict() returns, got "
                f"{type(state_dict).__name__}; nothing was loaded"
            )
        check_optimizer_state(optimizer, state_dict)
        optimizer.load_state_dict(state_dict)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(OneErrorForEveryMalformedState, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "ERR-005: a state that is not a dict raises ValueError")
