"""ERR-003 broken: an unknown precision or device name silently falls back to ``32-true`` or ``cpu``.

The ``PRECISIONS.get(name, default)`` lookup: a typo trains in the wrong precision or on the wrong device.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.devices import SUPPORTED_DEVICES
from lightning_optimizer.reference.precision import SUPPORTED_PRECISIONS
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ERR-003", ["test_unknown_precision_or_device"])


class Context(MutantContext):
    def __init__(self, precision: Any = "32-true", device: Any = "cpu", *args: Any, **kwargs: Any) -> None:
        precision = precision if precision in SUPPORTED_PRECISIONS else "32-true"
        device = device if device in SUPPORTED_DEVICES | {"xla"} else "cpu"
        super().__init__(precision, device, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
