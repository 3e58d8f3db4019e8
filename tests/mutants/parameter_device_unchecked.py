"""ERR-007 broken: ``wrap`` and ``add_param_group`` check a parameter's dtype but not its device.

An optimizer built on the model's parameters before ``prepare_module`` moved them (a CPU parameter in an XLA or
CUDA context) is accepted when its dtype fits; the inner step then mixes devices.
"""

from __future__ import annotations

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_parameter(self, param: torch.Tensor) -> None:
        self._plugin.check_parameter(param)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
