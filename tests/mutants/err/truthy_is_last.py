"""ERR-009 broken: ``batch(is_last=...)`` is coerced with ``bool(...)`` instead of being type-checked.

``1``, ``"yes"``, a tensor or any other truthy object marks the last batch of the epoch (and flushes its windows);
``None`` or ``0`` does not, all without an error.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ERR-009", ["test_non_bool_sync_grad_and_is_last"])


class Context(MutantContext):
    @override
    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        return super().batch(batch_idx, is_last=bool(is_last))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
