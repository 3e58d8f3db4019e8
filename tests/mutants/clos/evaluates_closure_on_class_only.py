"""CLOS-002 broken: ``evaluates_closure`` is read from the optimizer's class only, not from the instance.

The pattern of a declaration looked up with ``getattr(type(optimizer), ...)``, as a class-level trait: an optimizer
that sets the attribute on itself is then wrapped as a first-order one and may accumulate.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CLOS-002", ["test_an_optimizer_declaring_evaluates_closure_is_refused_accumulation[instance attribute]"]
)


def _declared_on_class(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.LBFGS) or getattr(type(optimizer), "evaluates_closure", False) is True


class Context(MutantContext):
    @override
    def wrap(self, optimizer: Any) -> Any:
        wrapper = super().wrap(optimizer)
        self.windows[-1].evaluates_closure = _declared_on_class(optimizer)  # the defect
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
