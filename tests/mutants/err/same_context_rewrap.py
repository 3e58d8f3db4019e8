"""ERR-010 broken: a second ``wrap`` of the same optimizer by the same context is accepted (a second window).

The implementer guards against the case ERR-010 motivates (two contexts, two loss scalers) by checking that the
optimizer's recorded owner is another context, and treats wrapping again in the same context as harmless, like
re-registering a module. ERR-010 refuses it too: two windows over the same gradients double every accumulation.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import WRAPPED_BY, Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ERR-010", ["test_an_optimizer_is_wrapped_once_while_its_context_lives"], blind="batch 1")


class _OtherContextsOnly(Refusals):
    @override
    def check_wrap(self, context, optimizer: object) -> None:  # type: ignore[no-untyped-def]
        from lightning_optimizer.reference.wrapper import WrappedOptimizer

        if isinstance(optimizer, WrappedOptimizer):
            raise TypeError(f"{type(optimizer).__name__} is already a wrapper; pass wrapper.optimizer")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"wrap expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        owner = WRAPPED_BY.get(optimizer)
        if owner is not None and owner() not in (None, context):  # only another live context conflicts
            raise ValueError(f"this {type(optimizer).__name__} is already wrapped by another training context")
        window = Window(optimizer)
        if window.evaluates_closure and context.parts.scaling.changes_gradients:
            raise TypeError(f"{type(optimizer).__name__} evaluates its closure itself: not under 16-mixed")
        if window.evaluates_closure and context.accumulate_grad_batches > 1:
            raise ValueError(f"{type(optimizer).__name__} evaluates its closure itself and cannot accumulate")
        for param in window.params():
            self.check_parameter(context, param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.refusals = _OtherContextsOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
