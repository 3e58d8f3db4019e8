"""SCHED-001 broken: the real step calls the optimizer class's ``step``, bypassing instance-level patches.

A scheduler built on the inner optimizer patches its ``step`` to notice the call; calling ``type(opt).step``
skips that patch, so the scheduler warns that ``lr_scheduler.step()`` ran before ``optimizer.step()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        inner = self._slots[index].optimizer
        type(inner).step(inner, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
