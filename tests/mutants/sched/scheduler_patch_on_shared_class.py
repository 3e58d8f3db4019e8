"""SCHED-001 broken: the ``step`` that an LR scheduler patches onto a wrapper is stored on the wrapper's class.

The context builds one wrapper class per optimizer type and keeps the scheduler's patch there, which is right
with one optimizer; a second wrapper of the same type then calls the patched ``step`` too, which steps the first
wrapper's optimizer in its place.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.wrapper import wrapper_class
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("SCHED-001", ["test_schedulers_of_two_wrappers_with_two_groups"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "step":
            setattr(type(self), name, staticmethod(value))
        else:
            super().__setattr__(name, value)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._classes: dict[type[Any], type[WrappedOptimizer[Any]]] = {}

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_classes"] = {}  # classes made at run time do not pickle; a copy makes its own
        return state

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        kind = type(self.windows[index].optimizer)
        if kind not in self._classes:  # one class per optimizer type and context
            self._classes[kind] = type(f"Wrapper{kind.__name__}", (Wrapper, wrapper_class(kind)), {})
        return self._classes[kind](self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
