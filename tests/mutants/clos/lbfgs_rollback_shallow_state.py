"""CLOS-003 broken: the roll-back of a failed LBFGS step restores a shallow copy of LBFGS's state.

Parameters and gradients are put back, and so is each state entry's dict, but its lists (``old_dirs``,
``old_stps``, ``ro``) and tensors (``prev_flat_grad``) are the ones LBFGS mutates in place: a step that fails after
a few evaluations leaves LBFGS's history extended and its previous gradient overwritten.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import (
    BackwardTransaction,
    FailurePolicyRule,
    ParameterRollback,
    PreparationTransaction,
    Transaction,
)
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLOS-003", ["test_failed_lbfgs_step_leaves_nothing_behind"])


class _ShallowRollback(ParameterRollback):
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(optimizer)
        self.state = {param: dict(entry) for param, entry in optimizer.state.items()}


class _WithShallowRollback:
    def __init__(self, policy: FailurePolicyRule) -> None:
        self._policy = policy
        self.name = policy.name

    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return _ShallowRollback(call.window.optimizer)
        return self._policy.begin(call, tensors, stash=stash, in_place=in_place)

    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        return self._policy.begin_preparation(tensors, changes=changes)

    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return self._policy.begin_backward(windows)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.failure = _WithShallowRollback(self.parts.failure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
