"""PROXY-004 broken: step hooks registered through any wrapper are kept by the context and fired on every real step.

As when a framework keeps one hook table per trainer (or strategy) instead of per optimizer: with one optimizer it
is right; with two, a hook registered on A fires on B's steps too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-004", ["test_step_hooks_fire_only_on_their_wrappers_real_steps"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def register_step_pre_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        context = self.training_context
        assert isinstance(context, Context)
        return _register(context.pre_hooks, hook)

    @override
    def register_step_post_hook(self, hook: Callable[..., Any]) -> RemovableHandle:
        context = self.training_context
        assert isinstance(context, Context)
        return _register(context.post_hooks, hook)


def _register(table: OrderedDict[int, Callable[..., Any]], hook: Callable[..., Any]) -> RemovableHandle:
    handle = RemovableHandle(table)
    table[handle.id] = hook
    return handle


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pre_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self.post_hooks: OrderedDict[int, Callable[..., Any]] = OrderedDict()

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        optimizer: torch.optim.Optimizer = window.optimizer
        for hook in list(self.pre_hooks.values()):
            hook(optimizer, (), kwargs)
        result = super().inner_step(window, kwargs, closure)
        for hook in list(self.post_hooks.values()):
            hook(optimizer, (), kwargs)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
