"""FSDP-001 broken: a context asked for sharded training prepares its modules for DDP instead.

As a framework whose FSDP option only changes the name of the strategy: each rank holds the whole model.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, Mutant

MUTANT = Mutant(
    "FSDP-001",
    [
        "test_sharded_windows_match_one_process[1-module-sgd]",
        "test_sharded_windows_match_one_process[1-module-sgd-clipped]",
        "test_sharded_windows_match_one_process[2-modules-adamw-sgd]",
        "test_sharded_windows_match_one_process[2-modules-clipped]",
        "test_sharded_windows_match_one_process[2-modules-toggle]",
        "test_sharded_windows_match_one_process[2-modules-raising-closures-discard]",
        "test_sharded_windows_match_one_process[2-modules-raising-closures-restore]",
        "test_sharded_windows_match_one_process[2-modules-raising-accumulating-toggle-discard]",
        "test_sharded_windows_match_one_process[2-modules-raising-accumulating-toggle-restore]",
    ],
    cells=FSDP,
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "strategy": "ddp"})


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
