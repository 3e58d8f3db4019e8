"""CKPT-004 broken: ``state_dict()`` is taken whenever asked, also while a ``step()`` runs or a window is prepared.

From a closure it saves the window half-way through the call (its gradients moved aside or half merged), and after
``unscale_gradients()`` a prepared window that a resumed context would average and unscale again.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def state_dict(self) -> dict[str, Any]:
        running, stages = self._call, [slot.stage for slot in self._slots]
        self._call = None  # no check of where the windows are: the state of whatever is there
        for slot in self._slots:
            slot.stage = WindowStage.READY
        try:
            return super().state_dict()
        finally:
            self._call = running
            for slot, stage in zip(self._slots, stages, strict=True):
                slot.stage = stage


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
