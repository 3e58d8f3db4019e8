"""DDP-002 broken: ``prepare_module`` does not wrap the module in ``DistributedDataParallel``.

Under a process group of several ranks each rank trains alone on its shard: nothing reduces the gradients, so
the ranks drift apart and none matches the single-process result on the global batch.
"""

from __future__ import annotations

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = self._plugin.convert_module(module.to(self.device))
        self._modules.append(module)
        return module


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
