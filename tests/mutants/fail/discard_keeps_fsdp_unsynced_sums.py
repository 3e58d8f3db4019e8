"""FAIL-003 broken: a discard clears the parameters' gradients but leaves FSDP's unsynced sums.

The framework's discard is "``p.grad = None`` for every parameter of the optimizer", written for one process and
DDP, where the window lives in the parameters' ``.grad``. Under FSDP2 the micro-steps that run without gradient
sync accumulate on the unsharded parameters instead; those survive the discard, and the next window's syncing
backward reduce-scatters them together with its own gradients, so the next real step applies the discarded
micro-steps too. (Whether the call wrote is still told from every tensor of the window, as the reference does.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Discard, DiscardTransaction, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, Mutant

MUTANT = Mutant(
    "FAIL-003",
    ["test_sharded_windows_match_one_process[2-modules-raising-accumulating-toggle-discard]"],
    cells=FSDP,
    blind="contract 2026.12.6",
)


class ParamsOnlyDiscard(Discard):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _ParamsOnlyTransaction(tensors)


class _ParamsOnlyTransaction(DiscardTransaction):
    @override
    def fail(self, call: Call) -> bool:
        if not (self.written() or call.reached_the_step):
            return False
        for param in call.window.params():  # the optimizer's parameters: "the window"
            param.grad = None
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = ParamsOnlyDiscard()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
