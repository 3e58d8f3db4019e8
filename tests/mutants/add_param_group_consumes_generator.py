"""PROXY-003 broken: ``add_param_group`` checks a one-shot iterable of parameters and forwards it exhausted.

The check iterates ``param_group["params"]`` as it is; a generator (``model.parameters()``, which torch accepts)
is empty by the time the inner optimizer reads it, so the group is added without its parameters.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _add_param_group(self, index: int, param_group: dict[str, Any]) -> None:
        params = param_group.get("params")
        candidates = [params] if isinstance(params, torch.Tensor) else params or []
        for param in candidates:
            if isinstance(param, torch.Tensor):
                self._check_parameter(param)
        self._slots[index].optimizer.add_param_group(param_group)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
