"""ZERO-003 broken: ``zero_grad_after_step`` takes any value and uses its truth (``1``, ``"no"`` and ``None`` pass).

``zero_grad_after_step="no"`` clears after every step, ``None`` leaves the gradients: nothing is refused.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-003", ["test_zero_grad_after_step_is_a_construction_setting"])


class Context(MutantContext):
    def __init__(self, *args: Any, zero_grad_after_step: Any = True, **kwargs: Any) -> None:
        super().__init__(*args, zero_grad_after_step=bool(zero_grad_after_step), **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
