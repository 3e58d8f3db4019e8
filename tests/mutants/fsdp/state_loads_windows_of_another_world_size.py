"""FSDP-006 broken: a context state taken with a window open loads at another world size.

As a state format that records the open windows' gradients but not the world size they were summed at: resumed in
one process, a window of two FSDP ranks goes on from rank 0's sums of its own half of each batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.parallel import distributed_world_size
from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("FSDP-006", ["test_a_sharded_state_resumes_in_one_process"], cells=FSDP)


class WorldSizeBlind(StateFormat):
    @override
    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        if isinstance(state, dict) and "world_size" in state:
            state = {**state, "world_size": distributed_world_size()}
        return super().check(context, state)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = WorldSizeBlind()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
