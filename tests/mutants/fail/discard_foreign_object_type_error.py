"""FAIL-009 broken: ``context.discard()`` of something that is not a wrapper raises ``TypeError``, not ``ValueError``.

The refusal tells two cases apart, as Python's conventions suggest: an object that is not a wrapper at all (the inner
optimizer, a module, ``None``) is the wrong type, ``TypeError``; a wrapper of another context is the right type with
the wrong value, ``ValueError``. The spec asks ``ValueError`` for "anything but a wrapper of this context", so a loop
that catches ``ValueError`` around ``discard`` (as it does for the other refusals of a value) misses the first case.

Plausible: passing ``wrapper.optimizer`` instead of the wrapper is the common mistake, and ``TypeError`` is what
every other refusal of a wrong kind of argument in the contract raises (ERR-001, ERR-004).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "FAIL-009",
    [
        "test_discard_refuses_what_it_cannot_drop",
    ],
    blind="batch 5",
)


class TypedDiscardRefusal(Refusals):
    @override
    def check_discard(self, context: TrainingContext, wrapper: object) -> Window:
        if not isinstance(wrapper, WrappedOptimizer):  # the defect: the wrong kind of object is a TypeError
            raise TypeError(
                f"discard() takes a wrapper of this training context (what its wrap() returned), got "
                f"{type(wrapper).__name__}"
            )
        return super().check_discard(context, wrapper)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = TypedDiscardRefusal()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-009: discard() of a non-wrapper raises TypeError")
