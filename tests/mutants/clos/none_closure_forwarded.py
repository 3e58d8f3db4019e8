"""CLOS-005 broken: a call without a closure hands the inner ``step`` ``closure=None`` instead of no argument.

The wrapper's ``step(closure=None)`` forwards its argument as it got it, ``optimizer.step(closure=closure)``, which
is what most wrappers do and is harmless for torch's optimizers (their default is ``None``). An inner ``step``
whose ``closure`` defaults to something else, or that tells "no closure given" from ``None``, sees ``None`` instead
of its own default. (Not under 16-mixed: ``GradScaler.step`` refuses any ``closure`` keyword.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLOS-005", ["test_a_call_without_a_closure_hands_the_inner_step_none"], blind="batch 1")


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if (
            closure is None
            and window.takes_closure
            and "closure" not in kwargs
            and not self.parts.scaling.changes_gradients
        ):
            kwargs = {**kwargs, "closure": None}  # the defect: forwarded as given
        return super().inner_step(window, kwargs, closure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
