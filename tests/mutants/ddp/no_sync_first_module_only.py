"""DDP-001 broken: micro-steps that do not close a window suppress the sync of the first prepared module only.

Like a strategy that keeps one ``self.model`` and enters ``self.model.no_sync()`` (Lightning's
``block_backward_sync``): with several modules prepared by one context, every module after the first
all-reduces on every micro-step, in the closure form and under ``toggle_model(sync_grad=False)`` alike.
Results stay right; the communication is not one all-reduce per window.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.parallel import DataParallel, Replicated, no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, Mutant

MUTANT = Mutant("DDP-001", ["test_closure_form_syncs_each_module_once_per_window"], cells=DDP)


class FirstModuleOnly(Replicated):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        return module, parallel if type(parallel) is not Replicated else FirstModuleOnly(parallel.modules)

    @override
    def without_sync(self) -> AbstractContextManager[None]:
        return no_sync(self.modules[:1])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.parts.parallel) is Replicated:
            self.parts.parallel = FirstModuleOnly(self.parts.parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
