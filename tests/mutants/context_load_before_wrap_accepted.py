"""CKPT-002 broken: a context state loaded before all of its optimizers are wrapped is accepted.

``load_state_dict`` loads the entries of the optimizers wrapped so far, in order, and ignores the rest (with none
wrapped, only the loss scaler's state), as a framework that restores each registered object's saved state by
position and skips the entries it has nothing registered for yet. A restore that runs before the optimizers are
built then loses the open windows it was meant to carry, silently; with some of them wrapped, those take their
entries and the others' are dropped.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _validated_entries(self, state_dict: object) -> list[dict[str, Any]]:
        entries = state_dict.get("optimizers") if isinstance(state_dict, dict) else None
        if isinstance(state_dict, dict) and isinstance(entries, list) and len(entries) > len(self._slots):
            return super()._validated_entries({**state_dict, "optimizers": entries[: len(self._slots)]})
        return super()._validated_entries(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
