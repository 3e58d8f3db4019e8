"""CLOS-005 broken: a real step calls the inner optimizer's ``step()`` without the closure.

As Lightning's and earlier references did for every optimizer but LBFGS: torch's first-order optimizers do not
notice (the closure has run already), but an optimizer that needs its closure (a two-pass one such as SAM, any
custom ``step(closure)``) gets ``None``.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CLOS-005",
    ["test_a_real_step_hands_the_inner_optimizer_the_closure", "test_a_two_pass_optimizer_evaluates_the_closure_again"],
)

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    @override
    def wrap(self, optimizer: OptimizerT) -> Any:
        wrapper = super().wrap(optimizer)
        self.windows[-1].takes_closure = False
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
