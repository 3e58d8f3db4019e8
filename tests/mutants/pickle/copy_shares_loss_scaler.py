"""PICKLE-001 broken: a copied wrapper keeps using the original's loss scaler.

As when a framework treats its ``GradScaler`` as process-global (kept in an accelerator or strategy singleton and
looked up again after unpickling): the copy's windows, gradients and optimizer are its own, but an overflow or a
growth of the copy's scale changes the original's, and the other way round.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling, LossScaling, NoLossScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("PICKLE-001", ["test_copy_and_original_overflow_and_grow_apart", ORACLE_PROPERTY], cells=F16)

_SCALERS: dict[int, LossScaling] = {}
_KEYS = itertools.count()


class Context(MutantContext):
    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        scaling = state["parts"].scaling
        if isinstance(scaling, GradScaling):
            key = next(_KEYS)
            _SCALERS[key] = scaling
            state["_scaler_key"] = key
        else:
            state["_scaler_key"] = None
        state["parts"] = dataclasses.replace(state["parts"], scaling=NoLossScaling())
        return state

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        key = state.pop("_scaler_key")
        super().__setstate__(state)
        self.parts.scaling = NoLossScaling() if key is None else _SCALERS[key]


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
