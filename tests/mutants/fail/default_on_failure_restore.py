"""FAIL-001 broken: ``on_failure`` defaults to ``"restore"`` instead of ``"discard"``.

A framework that rolled failed calls back exactly before the policy existed keeps that as its default "so that
nothing changes for existing users", and adds ``"discard"`` as the opt-in: FAIL-001 lists both values, and the
author read it for the values, not for which one is the default. Both policies work; a context built without
``on_failure`` pays the extra gradient set on every call and reports ``"restore"``.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("FAIL-001", ["test_failure_policy_is_a_construction_setting"], blind="contract 2026.12.6")


class Context(MutantContext):
    def __init__(
        self,
        precision: Any = "32-true",
        device: Any = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        on_failure: Any = "restore",
        **kwargs: Any,
    ) -> None:
        super().__init__(precision, device, accumulate_grad_batches, on_failure=on_failure, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
