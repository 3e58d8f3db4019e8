"""SCHED-001 broken: the real step calls the optimizer class's ``step``, bypassing instance-level patches.

A scheduler built on the inner optimizer patches its ``step`` to notice the call; calling ``type(opt).step``
skips that patch, so the scheduler warns that ``lr_scheduler.step()`` ran before ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "SCHED-001",
    [
        "test_scheduler_follows_real_steps_without_warnings[inner]",
        "test_scheduler_warns_after_accumulating_calls_as_torch_does[inner]",
    ],
)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        inner = window.optimizer
        type(inner).step(inner, **kwargs)
        return True if closure is None else None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
