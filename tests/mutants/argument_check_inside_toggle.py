"""ERR-001 broken: the step toggles the model before it checks its arguments, and a refused call stays toggled.

Lightning's ``toggle_optimizer()`` / ``untoggle_optimizer()`` pattern (two calls, not a context manager) around the
step body, with the argument checks between them: a ``TypeError`` for a bad closure or ``make_optimizer_step`` skips
the untoggle, so with two optimizers the other one's parameters are left with ``requires_grad=False``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        toggle = self._toggle(index, sync_grad=True)
        toggle.__enter__()  # toggle_optimizer()
        super()._check_step_arguments(index, closure, make_optimizer_step, kwargs)
        toggle.__exit__(None, None, None)  # untoggle_optimizer()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
