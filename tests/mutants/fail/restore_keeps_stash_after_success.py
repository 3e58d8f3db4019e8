"""FAIL-004 broken: the restoring policy keeps its copy of a window after the call succeeded, and reuses it.

A framework that snapshots a window once, when it opens, and restores that snapshot on any later failure: after
a successful micro-step the snapshot is stale, and a failed call puts the window back to where it was one or more
micro-steps earlier, losing the ones that succeeded in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Restore, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-004",
    ["test_restore_returns_to_the_last_successful_call", "test_closure_that_raises_changes_nothing[restore]"],
)


class _StaleRestore(Restore):
    def __init__(self) -> None:
        self.kept: dict[int, Transaction] = {}

    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        key = id(call.window)
        if call.window.length == 0 or key not in self.kept:
            # The window opens: one copy of it, kept (not stashed) until the window closes.
            self.kept[key] = super().begin(call, tensors, stash=False, in_place=in_place)
            self.kept[key].before_in_place(call)
        return _Kept(self.kept[key], super().begin(call, tensors, stash=stash, in_place=in_place))


class _Kept:
    def __init__(self, kept: Transaction, fresh: Transaction) -> None:
        self.kept, self._fresh = kept, fresh

    def before_in_place(self, call: Call) -> None:
        self._fresh.before_in_place(call)

    def after_closure(self, call: Call) -> None:
        self._fresh.after_closure(call)

    def cleared(self, set_to_none: bool) -> None:
        self._fresh.cleared(set_to_none)

    def commit(self) -> None:
        self._fresh.commit()  # the copy taken when the window opened stays

    def fail(self, call: Call) -> bool:
        self._fresh.fail(call)
        return self.kept.fail(call)  # back to the window as it was when it opened


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore":
            self.parts.failure = _StaleRestore()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
