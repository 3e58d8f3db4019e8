"""CLOS-005 broken: "takes a closure" is decided by a parameter named ``closure`` only, not by what binds.

The implementer inspects ``inspect.signature(optimizer.step).parameters`` for ``"closure"``, the obvious test.
A ``step(self, **kwargs)`` that forwards its closure (a wrapper optimizer, a lookahead that delegates) then gets
none on a real step, though ``step(closure=...)`` binds to it: a two-pass optimizer written that way can never
re-evaluate.
"""

from __future__ import annotations

import inspect
from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLOS-005", ["test_what_takes_a_closure_is_what_binds_closure"], blind="batch 1")


def _has_closure_parameter(optimizer: Any) -> bool:
    try:
        return "closure" in inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return True


class Context(MutantContext):
    @override
    def wrap(self, optimizer: Any) -> Any:
        wrapper = super().wrap(optimizer)
        self.windows[-1].takes_closure = _has_closure_parameter(optimizer)  # the defect: by name only
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
