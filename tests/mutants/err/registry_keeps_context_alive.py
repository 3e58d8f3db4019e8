"""ERR-010 broken: the registry of which context wraps each optimizer keeps the context alive, so it is never collected.

The implementer keys the registry weakly by optimizer (``weakref.WeakKeyDictionary``) but stores the context
itself as the value. The context holds the optimizer in its windows, so the value keeps its own key alive: once the
user drops the context (and ``gc.collect()`` runs), the optimizer still counts as wrapped by a live context and can
never be wrapped again. ERR-010: nothing but the user's references may keep a context alive.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ERR-010", ["test_an_optimizer_is_wrapped_once_while_its_context_lives"], blind="batch 1")

_OWNERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, Any] = weakref.WeakKeyDictionary()


class _StrongRegistry(Refusals):
    @override
    def check_wrap(self, context, optimizer: object) -> None:  # type: ignore[no-untyped-def]
        if isinstance(optimizer, torch.optim.Optimizer):
            owner = _OWNERS.get(optimizer)
            if owner is not None and owner is not context:
                raise ValueError(f"this {type(optimizer).__name__} is already wrapped by another training context")
        super().check_wrap(context, optimizer)
        _OWNERS[optimizer] = context  # type: ignore[index]


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.refusals = _StrongRegistry()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
