"""The hooks a framework registers on a training context (HOOK-001 to HOOK-004): tables, registration, calls."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.spec.context import BackwardHook, OptimizerStepHook, StepHook
from lightning_optimizer.spec.types import StepOutcome
from lightning_optimizer.spec.wrapper import OptimizerWrapper

__all__ = ["Hooks"]


class Hooks:
    """The context's registered hooks, one table per kind, each in registration order (``handle.id`` keys)."""

    def __init__(self) -> None:
        # OrderedDicts, as torch's own hook tables: RemovableHandle holds them by weak reference.
        self.before_backward: OrderedDict[int, BackwardHook] = OrderedDict()
        self.after_backward: OrderedDict[int, BackwardHook] = OrderedDict()
        self.before_optimizer_step: OrderedDict[int, OptimizerStepHook] = OrderedDict()
        self.after_step: OrderedDict[int, StepHook] = OrderedDict()

    def register(
        self,
        *,
        before_backward: BackwardHook | None,
        after_backward: BackwardHook | None,
        before_optimizer_step: OptimizerStepHook | None,
        after_step: StepHook | None,
    ) -> RemovableHandle:
        """Add the hooks given; refuse, before adding any, one that is not callable [HOOK-004]."""
        given: dict[str, Callable[..., None] | None] = {
            "before_backward": before_backward,
            "after_backward": after_backward,
            "before_optimizer_step": before_optimizer_step,
            "after_step": after_step,
        }
        for name, hook in given.items():
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be a callable or None, got {type(hook).__name__}")
        tables: dict[str, dict[int, Any]] = {
            "before_backward": self.before_backward,
            "after_backward": self.after_backward,
            "before_optimizer_step": self.before_optimizer_step,
            "after_step": self.after_step,
        }
        handle = RemovableHandle(self.before_backward, extra_dict=list(tables.values())[1:])
        for name, hook in given.items():
            if hook is not None:
                tables[name][handle.id] = hook
        return handle

    @staticmethod
    def run_backward(table: dict[int, BackwardHook], wrapper: OptimizerWrapper[Any], loss: torch.Tensor) -> None:
        """Call a backward table's hooks in order."""
        for hook in list(table.values()):
            hook(wrapper, loss)

    def run_before_optimizer_step(self, wrapper: OptimizerWrapper[Any]) -> None:
        """Call the ``before_optimizer_step`` hooks in order."""
        for hook in list(self.before_optimizer_step.values()):
            hook(wrapper)

    def run_after_step(self, wrapper: OptimizerWrapper[Any], outcome: StepOutcome) -> None:
        """Call the ``after_step`` hooks in order."""
        for hook in list(self.after_step.values()):
            hook(wrapper, outcome)
