"""HOOK-005 broken: ``copy.deepcopy`` of a context shares the original's hooks with the copy (pickle carries none).

The implementer knows hooks cannot be pickled and drops them there, but for ``deepcopy`` reasons that deep-copying a
framework's callbacks is wasteful and that a copy "should behave like the original", so the copy references the
original's hook tables. The copy's steps then call the framework's hooks of the original (and a ``remove()`` on
either side affects both).
"""

from __future__ import annotations

import copy
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-005", ["test_copies_carry_no_hooks[deepcopy]"], blind="batch 1")


class Context(MutantContext):
    def __deepcopy__(self, memo: dict[int, Any]) -> Context:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        state = copy.deepcopy(self.__getstate__(), memo)
        new.__setstate__(state)
        new.parts.hooks = self.parts.hooks  # the defect: the copy shares the original's hooks
        return new


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
