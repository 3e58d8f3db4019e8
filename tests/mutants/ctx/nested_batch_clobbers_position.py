"""CTX-003 broken: a nested ``batch()`` is refused, but only after it replaced the outer block's position.

The implementer sets the new position first and then checks the previous one (a natural order when the check is
written as "swap, and complain if something was there"). The nested call still raises ``RuntimeError``, but the
outer block goes on with the refused block's ``batch_idx`` and ``is_last``, so its schedule (STEP-003) changes.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.reference.refusals import check_flag
from lightning_optimizer.reference.windows import Batch, LoopPosition, check_count
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-003", ["test_a_batch_left_by_an_exception_ends_its_iteration"], blind="batch 1")


class _Batch(Batch):
    @override
    def __enter__(self) -> None:
        check_count("batch_idx", self.batch_idx)
        check_flag("is_last", self.is_last)
        windows = self.windows
        previous = windows.position
        windows.position = LoopPosition(self.batch_idx, self.is_last is True)  # swap in the new position first,
        if previous is not None:  # and complain if something was there
            raise RuntimeError("context.batch() blocks do not nest: leave the current batch first")


class Context(MutantContext):
    @override
    def batch(self, batch_idx: int, *, is_last: bool = False) -> _Batch:
        return _Batch(self.windows, batch_idx, is_last, self.end_iteration)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
