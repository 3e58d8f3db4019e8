"""ERR-007 broken: ``add_param_group`` checks only the first parameter of the new group.

A sample check (``params[0].device``, ``params[0].dtype``), as frameworks do to infer a group's device: a group whose
first parameter fits and whose second does not is accepted.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _add_param_group(self, index: int, param_group: dict[str, Any]) -> None:
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            params = [params]
        elif params is not None and not isinstance(params, list | tuple | set | frozenset):
            params = param_group["params"] = list(params)
        if params:
            first = next(iter(params))
            if isinstance(first, torch.Tensor):
                self._check_parameter(first)
        self._slots[index].optimizer.add_param_group(param_group)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
