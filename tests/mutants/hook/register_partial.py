"""HOOK-004 broken: a ``register_hooks`` call with one non-callable hook keeps the valid hooks it added before it.

The registration validates each hook as it adds it, in one loop, so ``register_hooks(before_backward=f,
after_step=3)`` raises ``TypeError`` only after ``f`` is in its table. A natural single-pass implementation; the
``TypeError`` is there, so a test that only checks the refusal passes, but the refused call left ``f`` registered
(with no handle to remove it).
"""

from __future__ import annotations

from typing import Any

from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-004", ["test_a_refused_registration_registers_nothing"], blind="batch 1")


class OnePassHooks(Hooks):
    @override
    def register(self, **given: Any) -> RemovableHandle:
        tables = [self.before_backward, self.after_backward, self.before_optimizer_step, self.after_step]
        handle = RemovableHandle(self.before_backward, extra_dict=tables[1:])
        for name, hook in given.items():
            if hook is None:
                continue
            if not callable(hook):  # the defect: checked while adding, not before
                raise TypeError(f"{name} must be a callable or None, got {type(hook).__name__}")
            getattr(self, name)[handle.id] = hook
        return handle


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.hooks = OnePassHooks()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = OnePassHooks()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
