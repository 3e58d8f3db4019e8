"""One wrapper's accumulation window and step counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_COUNTS = ("micro_steps", "steps", "skipped")


@dataclass
class Window:
    """Micro-steps accumulated since the last real step, whether they are prepared, and real-step counts."""

    micro_steps: int = 0
    prepared: bool = False
    steps: int = 0
    skipped: int = 0
    carried: list[torch.Tensor | None] | None = None
    """``zero_grad_after_step=False``: what the window took from its last taken step, per parameter, set aside."""
    carries: bool = False
    """Whether the window took something from its last taken step (what a discard's note must say went too)."""
    unscaled: bool = False
    """Whether the preparation of this window unscaled gradients (it had some of its own to unscale)."""

    def close(self, *, taken: bool) -> None:
        """A real step closed the window: taken, or skipped for non-finite gradients."""
        self.micro_steps, self.prepared, self.carried, self.carries, self.unscaled = 0, False, None, False, False
        if taken:
            self.steps += 1
        else:
            self.skipped += 1

    def state(self) -> dict[str, Any]:
        """The window as plain data."""
        return {
            "micro_steps": self.micro_steps,
            "prepared": self.prepared,
            "steps": self.steps,
            "skipped": self.skipped,
        }

    @staticmethod
    def state_problem(state: dict[str, Any]) -> str | None:
        """Why ``state`` is not a window's state, or ``None``."""
        for name in _COUNTS:
            value = state.get(name)
            if type(value) is not int or value < 0:
                return f"its {name!r} is not a count: {value!r}"
        if type(state.get("prepared")) is not bool:
            return "its 'prepared' is not a bool"
        return None

    def load(self, state: dict[str, Any]) -> None:
        """Restore what ``state()`` gave (checked by ``state_problem``); the carried part is the wrapper's to load."""
        self.micro_steps, self.prepared = state["micro_steps"], state["prepared"]
        self.steps, self.skipped = state["steps"], state["skipped"]
