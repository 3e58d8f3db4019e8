"""FAIL-005 broken: under ``"discard"`` a failed LBFGS step discards its gradients, not rolled back.

The framework applies its discard policy uniformly: a failed call that wrote into the window discards it, LBFGS
included ("discard means no copies"). LBFGS moves the parameters between its evaluations and builds its state
before the first one, so a step whose later evaluation raises leaves the parameters where the line search had
moved them and a half-built state; FAIL-005 says an optimizer that evaluates its closure is restored exactly
under both policies. Under ``"restore"`` it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Discard, DiscardTransaction, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("FAIL-005", ["test_failed_lbfgs_step_leaves_nothing_behind[discard]"], blind="contract 2026.12.6")


class UniformDiscard(Discard):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        return DiscardTransaction(tensors)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = UniformDiscard()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
