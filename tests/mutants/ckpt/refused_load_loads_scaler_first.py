"""CKPT-003 broken: a refused ``load_state_dict`` has already loaded the loss scaler's state.

The scaler is restored first and the optimizers' windows validated afterwards, so a state for another layout
raises ``ValueError`` with the live scale already replaced (after an overflow, the scale goes back to the other
state's).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CKPT-003", ["test_refused_load_after_an_overflow_changes_nothing"], cells=F16)


class Context(MutantContext):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("scaler")
        if self.scaler is not None and isinstance(saved, dict):
            self.scaler.load_state_dict({k: v for k, v in saved.items() if k != "pending_update"})
        super().load_state_dict(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
