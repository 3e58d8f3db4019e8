"""REENT-001 broken: a re-entered ``step()`` that the closure catches still fails the outer call.

The implementer marks the running call as tainted when a nested ``step()`` is refused and raises when the closure
returns, reasoning that a closure that tried to step another optimizer is a bug the user must see even if they
swallowed it. The text says the refusal is the closure's to handle: caught, the outer call goes on.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("REENT-001", ["test_a_caught_refusal_of_a_reentered_step_lets_the_outer_call_go_on"], blind="batch 1")


class TaintingRefusals(Refusals):
    def __init__(self) -> None:
        self.tainted: Any = None

    @override
    def check_step(self, context: Any, window: Any, closure: object, make_optimizer_step: object, kwargs: Any) -> None:
        if context.windows.call is not None:
            self.tainted = context.windows.call  # remember which call a nested step() was refused in
        super().check_step(context, window, closure, make_optimizer_step, kwargs)

    @override
    def __getstate__(self) -> dict[str, Any]:
        return {"tainted": None}


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = TaintingRefusals()

    @override
    def run_closure(self, call: Call, index: int, closure: Any) -> Any:
        refusals = self.parts.refusals
        try:
            result = super().run_closure(call, index, closure)
        finally:
            tainted = getattr(refusals, "tainted", None) is call
            if tainted:
                refusals.tainted = None  # type: ignore[attr-defined]
        if tainted:  # the defect: the caught refusal fails the outer call
            raise RuntimeError("step() was called from inside this step()'s closure")
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
