"""ZERO-004 broken: ``zero_grad_after_step=False`` is read back, but every real step clears its gradients anyway.

The setting is taken and reported; the zeroing is the default's, so nothing is ever left to the user or carried.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.zeroing import ClearAfterStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-004",
    [
        "test_a_taken_step_leaves_the_gradients_it_applied[user-zero-grad]",
        "test_a_window_carries_on_every_device",
        "test_a_window_applies_what_it_carries_plus_its_own_mean",
        "test_zero_grad_clears_what_the_last_step_left",
        ORACLE_PROPERTY,
    ],
)


class ClearsAnyway(ClearAfterStep):
    clears_after_step = False


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = ClearsAnyway()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
