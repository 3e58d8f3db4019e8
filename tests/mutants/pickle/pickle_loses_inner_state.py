"""PICKLE-001 broken: a pickled or deep-copied wrapper comes back with a fresh inner optimizer.

As Lightning's and Fabric's wrappers, which do not carry their inner optimizer through ``pickle``: the copy
rebuilds one on the same parameters, so its momentum buffers (and every other piece of optimizer state) are
gone and it continues another trajectory.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PICKLE-001", ["test_copies_continue_independently"])


class Context(MutantContext):
    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for window in self.windows:
            window.optimizer.state = defaultdict(dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
