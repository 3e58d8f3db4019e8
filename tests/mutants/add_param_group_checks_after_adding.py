"""ERR-007 broken: ``add_param_group`` adds the group first and checks its parameters afterwards.

A refused group is already in the inner optimizer's ``param_groups`` when the ``ValueError`` comes: the caller
sees an error, but the optimizer steps the bad parameter from then on.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _add_param_group(self, index: int, param_group: dict[str, Any]) -> None:
        optimizer = self._slots[index].optimizer
        optimizer.add_param_group(param_group)
        for param in optimizer.param_groups[-1]["params"]:
            self._check_parameter(param)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
