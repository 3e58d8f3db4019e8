"""DDP-001 broken: a closure never runs under ``no_sync()``; every micro-step all-reduces its gradients.

Correct results at ``accumulate_grad_batches`` times the communication: the accumulation window does not
suppress DDP's gradient sync, as in loops that forget ``model.no_sync()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        return super()._run_closure(index, closure, sync_grad=True)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
