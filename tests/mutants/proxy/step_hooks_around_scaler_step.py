"""PROXY-004 broken: the wrapper fires the step hooks itself, around the loss scaler's step, skipped or not.

As a wrapper whose own ``step`` carries torch's hook machinery (``Optimizer.profile_hook_step`` on a subclass of
``torch.optim.Optimizer``) and runs the inner step through ``scaler.step``: the hooks fire for every real step the
wrapper starts, including the ones ``GradScaler`` then skips for non-finite gradients, for every optimizer kind.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("PROXY-004", ["test_step_hooks_do_not_fire_on_skipped_steps"], cells=F16)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        optimizer: Any = window.optimizer
        if closure is not None:
            return super().inner_step(window, kwargs, closure)
        pre, post = optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks
        for hook in list(pre.values()):
            hook(optimizer, (), kwargs)
        optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks = OrderedDict(), OrderedDict()
        try:
            result = super().inner_step(window, kwargs, closure)
        finally:
            optimizer._optimizer_step_pre_hooks, optimizer._optimizer_step_post_hooks = pre, post
        for hook in list(post.values()):
            hook(optimizer, (), kwargs)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
