"""FSDP-006 broken: a sharded context's ``state_dict`` keeps the sharded gradients, not the unsynced sums.

As a framework that checkpoints what ``torch.distributed.checkpoint`` sees (the shards' ``.grad``) and not what
FSDP2 accumulated on the unsharded parameters in micro-steps without sync: a resumed window loses them.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, Mutant

MUTANT = Mutant("FSDP-006", ["test_sharded_checkpoint_resumes_open_windows"], cells=FSDP)


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for entry in state["optimizers"]:
            entry["grads"] = [None] * len(entry["grads"])
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
