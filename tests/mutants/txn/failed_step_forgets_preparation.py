"""TXN-001 broken: a failed call puts the gradients back but leaves the window ready, prepared or not before.

A window that ``unscale_gradients()`` had prepared keeps its prepared gradients after a failed closing step, but not
its stage: ``zero_grad()`` is no longer refused, and the retry averages (and clips) the window a second time. Under
``on_failure="restore"`` the transaction puts the gradients back and forgets that the window was prepared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Restore, RestoreTransaction, Transaction
from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("TXN-001", ["test_failed_inner_step_leaves_the_window[restore-prepared-backward-clipped]"])


class _ForgetsThePreparation(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        call.stage_before = WindowStage.READY  # what the window goes back to: ready, prepared before or not
        return super().fail(call)


class _RestoreForgettingThePreparation(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _ForgetsThePreparation(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore":
            self.parts.failure = _RestoreForgettingThePreparation()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
