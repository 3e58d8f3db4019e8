"""FAIL-006 broken: ``load_state_dict`` accepts a state saved under the other failure policy.

The framework treats ``on_failure`` as run configuration, like a command-line flag that a resumed run may
change, and reads a state's policy as advisory: the state's ``on_failure`` is replaced by the loading context's
before the state is checked. ``state_dict()`` still carries the policy, but a checkpoint of one policy loads
into a context of the other, which FAIL-006 and CKPT-003 refuse with ``ValueError``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("FAIL-006", ["test_states_and_copies_carry_the_failure_policy"], blind="contract 2026.12.6")


class PolicyAdvisoryState(StateFormat):
    @override
    def check(self, context: Any, state: object) -> list[dict[str, Any]]:
        if isinstance(state, dict) and state.get("on_failure") in ("discard", "restore"):
            state = {**state, "on_failure": context.on_failure}  # the running context's setting wins
        return super().check(context, state)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = PolicyAdvisoryState()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
