"""ERR-005 broken: an optimizer state without ``"state"`` and ``"param_groups"`` is refused naming the first missing
key only.

The wrapper's ``load_state_dict`` checks torch's two keys in a loop and raises ``ValueError`` at the first one that
is missing: a dict with neither (the context's own state, a module's state dict, a hyperparameter dict handed to the
wrong ``load_state_dict``) is refused for lacking ``'state'`` alone. The user fixes that and is refused again for
``'param_groups'``; the contract asks for the missing keys named at once.

Plausible: "raise at the first problem" is how validation loops are usually written.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "ERR-005",
    [
        "test_a_malformed_optimizer_state_is_refused[{}]",
        "test_a_malformed_optimizer_state_is_refused[a dict of other keys]",
    ],
    blind="batch 4",
)


class FirstMissingKey(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optimizer = self.optimizer
        if type(optimizer).load_state_dict is torch.optim.Optimizer.load_state_dict:
            name = type(optimizer).__name__
            if not isinstance(state_dict, dict):
                raise TypeError(
                    f"{name}.load_state_dict expects the dict that {name}.state_dict() returns, got "
                    f"{type(state_dict).__name__}; nothing was loaded"
                )
            for key in ("state", "param_groups"):
                if key not in state_dict:  # the defect: refused at the first missing key
                    raise ValueError(
                        f"this is not an optimizer state: it lacks {key!r} (an optimizer's state_dict() holds it); "
                        f"nothing was loaded into {name}"
                    )
        optimizer.load_state_dict(state_dict)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(FirstMissingKey, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "ERR-005: a state without both keys is refused naming one")
