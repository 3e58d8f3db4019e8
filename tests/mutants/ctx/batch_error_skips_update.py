"""CTX-003 broken: a ``batch()`` left by an exception releases the position but skips the loss scaler's update.

The implementer puts only the position's release in ``finally`` and ends the iteration after it, on the reasoning
that an iteration that raised is abandoned and its scaler update should not count. CTX-003 says the block ends the
iteration as a normal exit does: the real steps it took update the scale now, not at the end of the next block.
"""

from __future__ import annotations

from types import TracebackType

from typing_extensions import override

from lightning_optimizer.reference.windows import Batch
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CTX-003", ["test_a_batch_left_by_an_exception_ends_its_iteration"], cells=F16, blind="batch 1")


class _Batch(Batch):
    @override
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.windows.position = None
        if exc_type is None:
            self.end_iteration()


class Context(MutantContext):
    @override
    def batch(self, batch_idx: int, *, is_last: bool = False) -> _Batch:
        return _Batch(self.windows, batch_idx, is_last, self.end_iteration)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
