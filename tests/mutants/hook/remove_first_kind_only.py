"""HOOK-004 broken: ``remove()`` on a handle only stops its ``before_backward`` hook, not the other kinds.

The implementation reuses ``torch.utils.hooks.RemovableHandle`` but builds it on the first table only, forgetting
its ``extra_dict`` argument: the handle's id keys every table, yet ``remove()`` deletes it from one. A test that
registers and removes a single ``before_backward`` hook passes; hooks of other kinds keep firing after removal.
"""

from __future__ import annotations

from typing import Any

from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-004", ["test_hooks_of_several_registrations_run_in_registration_order"], blind="batch 1")


class OneTableHandleHooks(Hooks):
    @override
    def register(self, **given: Any) -> RemovableHandle:
        for name, hook in given.items():
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be a callable or None, got {type(hook).__name__}")
        handle = RemovableHandle(self.before_backward)  # the defect: no extra_dict for the other tables
        for name, hook in given.items():
            if hook is not None:
                getattr(self, name)[handle.id] = hook
        return handle


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.hooks = OneTableHandleHooks()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = OneTableHandleHooks()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
