"""FAIL-008 broken: a wrapper's ``load_state_dict`` that raises puts back copies of the state, not its objects.

The wrapper keeps a shallow copy of the inner optimizer's ``state`` and of each parameter group before loading and,
when the load raises (a ``load_state_dict`` post-hook, an override that fails after torch's load), assigns those
copies to ``optimizer.state`` and ``optimizer.param_groups``. The entries are equal, but the objects are new: a group
dict held by the caller (to change its ``lr``, as a scheduler or a hand-written warm-up does) is no longer the
optimizer's, and what is written to it is silently ignored from then on.

Plausible: "as they were" is naturally tested with ``==``; the spec's "(the same objects, the same entries)" is a
parenthesis.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.refusals import check_optimizer_state
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_optimizer_change_leaves_the_optimizer[Adam-load_state_dict]",
        "test_a_failed_optimizer_change_leaves_the_optimizer[SGD momentum-load_state_dict]",
    ],
    blind="batch 5",
)


class CopyRestoringWrapper(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optimizer = self.optimizer
        check_optimizer_state(optimizer, state_dict)
        state = defaultdict(dict, optimizer.state)
        groups = [dict(group) for group in optimizer.param_groups]
        try:
            optimizer.load_state_dict(state_dict)
        except BaseException:
            optimizer.state = state  # the defect: new objects with the old entries
            optimizer.param_groups = groups
            raise


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(CopyRestoringWrapper, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed optimizer load puts back copies, not the same objects")
