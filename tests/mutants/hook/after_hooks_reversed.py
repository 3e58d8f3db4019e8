"""HOOK-004 broken: ``after_backward`` and ``after_step`` hooks run in reverse registration order.

An engineer who thinks of each registration as a layer wrapped around the call (like nested context managers or
middleware) naturally unwinds the "after" hooks last-in-first-out, so the first registration's before/after pair
encloses the later ones. The text says hooks of each kind run in registration order; this reads it for "before"
hooks only.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.types import StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-004", ["test_hooks_of_several_registrations_run_in_registration_order"], blind="batch 1")


class NestedHooks(Hooks):
    """Before-hooks in registration order, after-hooks unwound in reverse (the defect)."""

    @override
    def run_backward(self, table: Any, wrapper: Any, loss: torch.Tensor) -> None:  # type: ignore[override]
        hooks = list(table.values())
        if table is self.after_backward:
            hooks.reverse()
        for hook in hooks:
            hook(wrapper, loss)

    @override
    def run_after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        for hook in reversed(list(self.after_step.values())):
            hook(wrapper, outcome)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.hooks = NestedHooks()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = NestedHooks()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
