"""CLOS-002 broken: ``evaluates_closure`` is honoured on the optimizer instance only, not on its class.

The implementer reads the declaration with ``vars(optimizer).get("evaluates_closure")``, treating it as a per-object
flag a user sets after construction. An optimizer class that declares ``evaluates_closure = True`` is then treated
as a first-order optimizer: ``step(make_optimizer_step=False)`` accumulates instead of being refused, and its
evaluations are not cleared and rolled back as LBFGS's are. (``wrap`` still refuses accumulation for it, as the check
at construction reads the class.)
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CLOS-002",
    ["test_an_optimizer_declaring_evaluates_closure_is_refused_accumulation[class attribute]"],
    blind="batch 1",
)


def _declared_on_instance(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.LBFGS) or vars(optimizer).get("evaluates_closure", False) is True


class Context(MutantContext):
    @override
    def wrap(self, optimizer: Any) -> Any:
        wrapper = super().wrap(optimizer)
        self.windows[-1].evaluates_closure = _declared_on_instance(optimizer)  # the defect
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
