"""FAIL-009 broken: ``context.discard()`` clears the wrapper's gradients before it checks that it may discard.

The discard first sets to ``None`` the gradients of the wrapper's inner optimizer (the part common to every path),
then looks the window up among the context's own and checks that no ``step()`` runs. A wrapper of another context is
refused with ``ValueError``, and a discard from inside a closure with ``RuntimeError``, as the spec says, but the
wrapper's gradients are gone by then: the other context's open window (or the running step's) has lost its
micro-steps while its length still counts them.

Plausible: the refusal is there and raises the right exceptions; "before anything changes" is the part that decides
where it must be, and "drop the gradients, then update the bookkeeping" is the natural order of a discard.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.wrapper import OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-009",
    [
        "test_discard_refuses_what_it_cannot_drop",
    ],
    blind="batch 5",
)


class Context(MutantContext):
    @override
    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        if isinstance(wrapper, WrappedOptimizer):
            for group in wrapper.optimizer.param_groups:  # the defect: cleared before the refusals
                for param in group["params"]:
                    param.grad = None
        super().discard(wrapper)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-009: a refused discard() has cleared the wrapper's gradients already")
