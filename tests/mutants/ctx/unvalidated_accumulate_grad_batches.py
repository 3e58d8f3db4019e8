"""CTX-001 broken: ``accumulate_grad_batches`` is stored as given; ``0``, ``-1``, ``2.0`` or ``"2"`` construct.

The error, if any, comes much later and far from the cause (a modulo by zero inside the loop, or never).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-001", ["test_invalid_accumulate_grad_batches"])


class Unvalidated(Accumulation):
    def __init__(self, every: object) -> None:
        self.accumulate_grad_batches = every  # type: ignore[assignment]  # stored as given


class Context(MutantContext):
    def __init__(
        self, precision: Any = "32-true", device: Any = "cpu", accumulate_grad_batches: Any = 1, **kwargs: Any
    ) -> None:
        super().__init__(precision, device, **kwargs)
        self.parts.accumulation = Unvalidated(accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
