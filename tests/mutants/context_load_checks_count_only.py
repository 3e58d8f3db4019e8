"""CKPT-003 broken: the context's ``load_state_dict`` checks the number of optimizers but not the shapes.

A state with the same optimizers over differently shaped parameters loads part of its gradients, then fails
with torch's ``RuntimeError``. The check only tries a state with another number of optimizers (``UNCAUGHT`` in
``tests/test_mutants.py``).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _validated_entries(self, state_dict: object) -> list[dict[str, Any]]:
        if not isinstance(state_dict, dict) or len(state_dict.get("optimizers", ())) != len(self._slots):
            raise ValueError(f"the state does not hold {len(self._slots)} optimizers")
        entries: list[dict[str, Any]] = state_dict["optimizers"]
        return entries


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
