"""FAIL-008 broken: a wrapper's ``add_param_group`` that raises inside the inner optimizer leaves what it added.

The wrapper makes every refusal of its own first (not a dict, a step running, a window open, ERR-007's device and
dtype check) and then forwards to the inner optimizer with nothing kept: torch validates a group before it appends
it, so a forwarded call looked all-or-nothing. An inner optimizer that overrides ``add_param_group`` (one that
builds per-group buffers after ``super().add_param_group``) and raises after torch appended leaves the new group in
``param_groups``: its parameters are stepped from then on, although the call failed, and a retry adds them twice.

Plausible: torch's own ``add_param_group`` never raises after appending; the failure only comes from a subclass.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_optimizer_change_leaves_the_optimizer[Adam-add_param_group]",
        "test_a_failed_optimizer_change_leaves_the_optimizer[SGD momentum-add_param_group]",
    ],
    blind="batch 5",
)


class ForwardingWrapper(WrappedOptimizer[Any]):
    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        context = self.training_context
        window = context.windows.all[self.window_index]
        candidates = context.parts.refusals.check_param_group(context, window, param_group)
        if not isinstance(param_group["params"], list | tuple | torch.Tensor | set | frozenset):
            param_group["params"] = candidates
        self.optimizer.add_param_group(param_group)  # the defect: nothing kept to put back if it raises
        context.parts.outside.joined(window)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(ForwardingWrapper, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed add_param_group leaves the group it added")
