"""CKPT-002 broken: the context's checkpoint refers to the open window's gradients kept in process memory.

``state_dict`` parks the gradients in a module-level store and saves only a key into it, so a checkpoint
resumes in the process that saved it and nowhere else.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CKPT-002", ["test_resume_in_a_fresh_process"])

_STORE: dict[int, list[list[torch.Tensor | None]]] = {}
_KEYS = itertools.count()


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        key = next(_KEYS)
        _STORE[key] = [entry["grads"] for entry in state["optimizers"]]
        for entry in state["optimizers"]:
            entry["grads"] = [None] * len(entry["grads"])
        state["window_store_key"] = key
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        parked = _STORE.get(state_dict["window_store_key"], [])
        for entry, grads in zip(state_dict["optimizers"], parked, strict=False):
            entry["grads"] = grads
        super().load_state_dict(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
