"""HOOK-004 broken: ``register_hooks`` takes a hook that is not callable.

The mistake surfaces later, inside some backward or step, as ``'int' object is not callable``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-004", ["test_a_raising_hook_fails_the_call_as_a_raising_closure_does"])


class Context(MutantContext):
    @override
    def register_hooks(self, **hooks: Any) -> Any:
        tables = self.parts.hooks
        handle = tables.register(before_backward=None, after_backward=None, before_optimizer_step=None, after_step=None)
        for kind, hook in hooks.items():
            if hook is not None:
                getattr(tables, kind)[handle.id] = hook
        return handle


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
