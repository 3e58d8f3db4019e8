"""PROXY-004 broken: step hooks registered through the wrapper go into the wrapper's own hook tables.

As when a wrapper runs ``Optimizer.__init__`` on itself: the inner optimizer's ``step`` never fires them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-004", ["test_step_hooks_fire_on_real_steps"])


class Wrapper(WrappedOptimizer[Any]):
    def __init__(self, context: TrainingContext, index: int) -> None:
        super().__init__(context, index)
        object.__setattr__(self, "_optimizer_step_pre_hooks", OrderedDict())
        object.__setattr__(self, "_optimizer_step_post_hooks", OrderedDict())

    @override
    def register_step_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        return torch.optim.Optimizer.register_step_pre_hook(self, hook)

    @override
    def register_step_post_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        return torch.optim.Optimizer.register_step_post_hook(self, hook)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
