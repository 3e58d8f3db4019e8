"""SURFACE-002 broken (statically): ``conformance_info`` is annotated ``-> Any``.

The behaviour is the reference's, but mypy cannot check the context or its wrappers against the protocols.
"""

from __future__ import annotations

from typing import Any

from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("SURFACE-002", ["test_static_surface"])


def conformance_info() -> Any:
    return mutant_info(MutantContext, __name__)
