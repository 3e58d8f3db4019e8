"""FSDP-001 broken: a context asked for sharded training prepares its modules for DDP instead.

As a framework whose FSDP option only changes the name of the strategy: each rank holds the whole model.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "strategy": "ddp"})


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
