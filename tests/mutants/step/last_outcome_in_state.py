"""STEP-004 broken: the context's ``state_dict()`` saves each ``last_outcome``; ``load_state_dict`` restores it.

A checkpoint that "continues the identical trajectory" looks like it should bring back everything a wrapper
reports, and copies (PICKLE-001) do carry ``last_outcome``; the implementer makes checkpoints agree with copies.
STEP-004 says the outcome is what this wrapper's last call did, not part of the context's state: a freshly loaded
context's wrappers report ``None`` until their first call.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.types import StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-004", ["test_last_outcome_is_not_in_the_context_state"], blind="batch 1")


class _OutcomeState(StateFormat):
    @override
    def save(self, context) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        state = super().save(context)
        for entry, window in zip(state["optimizers"], context.windows, strict=True):
            entry["last_outcome"] = None if window.last_outcome is None else window.last_outcome.value
        return state

    @override
    def load(self, context, state: object) -> None:  # type: ignore[no-untyped-def]
        super().load(context, state)
        assert isinstance(state, dict)
        for window, entry in zip(context.windows, state["optimizers"], strict=True):
            saved = entry.get("last_outcome")
            if saved is not None:
                window.last_outcome = StepOutcome(saved)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.state = _OutcomeState()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
