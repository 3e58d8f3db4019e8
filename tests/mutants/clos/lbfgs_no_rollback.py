"""CLOS-003 broken: an LBFGS step whose closure raises leaves LBFGS's state, gradients and parameters behind.

The behaviour of this project's reference before contract 2026.12, and of every wrapper that calls
``optimizer.step(closure)`` bare: an evaluation that raises after its backward leaves its gradients, one that raises
after LBFGS moved the parameters leaves them moved and LBFGS's history extended. Under either failure policy the
step of an optimizer that evaluates its closure runs in a transaction that puts nothing back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import (
    BackwardTransaction,
    FailurePolicyRule,
    PreparationTransaction,
    Transaction,
)
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLOS-003", ["test_failed_lbfgs_step_leaves_nothing_behind"])


class _NoRollback:
    def before_in_place(self, call: Call) -> None:
        """Nothing kept."""

    def after_closure(self, call: Call) -> None:
        """Nothing to merge."""

    def cleared(self, set_to_none: bool) -> None:
        """Nothing to forget."""

    def commit(self) -> None:
        """Nothing kept."""

    def fail(self, call: Call) -> bool:
        return False  # parameters, gradients and state as the failed step left them


class _WithoutRollback:
    def __init__(self, policy: FailurePolicyRule) -> None:
        self._policy = policy
        self.name = policy.name

    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return _NoRollback()
        return self._policy.begin(call, tensors, stash=stash, in_place=in_place)

    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        return self._policy.begin_preparation(tensors, changes=changes)

    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return self._policy.begin_backward(windows)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.failure = _WithoutRollback(self.parts.failure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
