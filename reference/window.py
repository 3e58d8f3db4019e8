"""One optimizer's accumulation window: its stage between and during calls, its length, counts and outcome.

Stages and transitions (each checked where it can break, :mod:`.refusals`; the error says what to call instead)::

    READY --step() that does not close--> ACCUMULATING --closure returns--> READY (one micro-step longer)
    READY --unscale_gradients()---------> PREPARED
    READY or PREPARED --closing step()--> CLOSING --inner step returns--> READY (empty, counted)
    ACCUMULATING or CLOSING --raises----> what the failure policy leaves (:mod:`.failure`)

    refused: a step() that does not close a PREPARED window; zero_grad() or backward() of a PREPARED window;
    unscale_gradients() inside an ACCUMULATING closure; any step() while another step() of the context runs.

Every change of stage goes through :meth:`Window.move`, which checks it against :data:`NEXT_STAGES`; the refusals
check the user's calls before any transition, so a transition the table forbids is the reference's own bug.
"""

from __future__ import annotations

import enum
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_optimizer.spec.types import StepOutcome

__all__ = ["NEXT_STAGES", "Window", "WindowStage", "evaluates_closure", "takes_closure"]


def evaluates_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` declares that its ``step`` evaluates the closure itself, as often as it needs.

    The declaration is a true ``evaluates_closure`` attribute of the optimizer (or its class); torch's ``LBFGS``,
    which has none, is the one torch optimizer that does. [CLOS-002]
    """
    return isinstance(optimizer, torch.optim.LBFGS) or getattr(optimizer, "evaluates_closure", False) is True


def takes_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` accepts a ``closure`` keyword (by name, or as any keyword). [CLOS-005]"""
    try:
        parameters = inspect.signature(optimizer.step).parameters.values()
    except (TypeError, ValueError):  # no signature to read: torch's convention, step(closure=None)
        return True
    return any(p.name == "closure" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class WindowStage(enum.Enum):
    """Where one optimizer's window is."""

    READY = "ready"
    """Between calls: the window holds ``length`` accumulated micro-steps (none after a real step)."""
    PREPARED = "prepared"
    """``unscale_gradients()`` made the gradients what the real step applies: only the closing step may follow."""
    ACCUMULATING = "accumulating"
    """The closure of a ``step()`` that does not close the window is running."""
    CLOSING = "closing"
    """A ``step()`` that closes the window is running: its closure, the preparation or the inner step."""

    __hash__ = object.__hash__  # members are singletons compared by identity: a C-level hash for the table's lookups


NEXT_STAGES: dict[WindowStage, frozenset[WindowStage]] = {
    WindowStage.READY: frozenset({WindowStage.ACCUMULATING, WindowStage.CLOSING, WindowStage.PREPARED}),
    WindowStage.PREPARED: frozenset({WindowStage.CLOSING, WindowStage.READY}),
    WindowStage.ACCUMULATING: frozenset({WindowStage.READY}),
    WindowStage.CLOSING: frozenset({WindowStage.READY, WindowStage.PREPARED}),
}
"""The transitions a window may take. ``PREPARED`` to ``READY``: a failed preparation or a discarded window;
``CLOSING`` to ``PREPARED``: a failed closing call that kept a window ``unscale_gradients()`` had prepared."""


@dataclass
class Window:
    """What the context keeps for one wrapped optimizer."""

    optimizer: torch.optim.Optimizer
    length: int = 0
    """Micro-steps accumulated since the last real step (the open window's length)."""
    steps: int = 0
    """Real steps taken (skipped ones do not count)."""
    last_outcome: StepOutcome | None = None
    stage: WindowStage = WindowStage.READY
    evaluates_closure: bool = field(init=False)
    """The optimizer declares that its ``step`` evaluates the closure itself (LBFGS)."""
    takes_closure: bool = field(init=False)
    """The optimizer's ``step`` takes a ``closure``: a real step hands it one."""
    left: dict[torch.Tensor, tuple[weakref.ref[torch.Tensor], int]] | None = field(default=None, repr=False)
    """``zero_grad_after_step=False``: the gradients the last taken real step left on each parameter, not taken yet
    (a reference that does not keep them alive, and the version counter they had) [ZERO-004]; the user's, not state."""
    carried: dict[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    """``zero_grad_after_step=False``: the gradients the window took from the last step, set aside until its
    preparation adds them to its mean [ZERO-005]."""

    known: tuple[torch.Tensor, ...] = field(init=False, repr=False)
    """The parameters the window was built with, in order: a change from outside is found by identity [WIN-001]."""
    known_ids: list[int] = field(init=False, repr=False)
    """``id`` of each of :attr:`known` (which keeps them alive, so no id is reused while it is known)."""
    holding: list[torch.Tensor] = field(init=False, repr=False)
    """The parameters that held a gradient when the window's last accumulating call returned [WIN-002]."""

    def __post_init__(self) -> None:
        self.evaluates_closure = evaluates_closure(self.optimizer)
        self.takes_closure = takes_closure(self.optimizer)
        self.know(self.params())
        self.holding = []

    def know(self, params: list[torch.Tensor]) -> None:
        """The window's parameters are ``params`` from now on [WIN-001]."""
        self.known = tuple(params)
        self.known_ids = list(map(id, params))

    def __getstate__(self) -> dict[str, Any]:
        # What the last step left is the user's, on gradients a copy does not carry (and weak references do not copy);
        # ids are the original's: a copy takes those of its own parameters.
        state = {**self.__dict__, "left": None}
        state.pop("known_ids", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.known_ids = list(map(id, self.known))

    def move(self, to: WindowStage) -> None:
        """Go to stage ``to``; a transition :data:`NEXT_STAGES` does not allow is the reference's own bug."""
        if to not in NEXT_STAGES[self.stage]:
            raise AssertionError(f"a window cannot go from {self.stage.value} to {to.value}")
        self.stage = to

    def holds_left(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is still what the last taken real step left on it (not taken yet)."""
        left = self.left
        if left is None or param.grad is None:
            return False
        entry = left.get(param)
        return entry is not None and entry[0]() is param.grad

    def params(self) -> list[torch.Tensor]:
        """The optimizer's parameters, every group, in order (read each time: groups can be added)."""
        return [param for group in self.optimizer.param_groups for param in group["params"]]

    def clear_gradients(self) -> None:
        """Set the gradients of the parameters to ``None`` [ZERO-001, CLOS-004].

        Not the inner optimizer's ``zero_grad``: that is the user's call (``wrapper.zero_grad()``), and an override
        of it (or a framework that counts it) sees only the user's calls, not the context's own clearing.
        """
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                param.grad = None

    def has_gradients(self) -> bool:
        """Whether any of the parameters has a gradient."""
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    return True
        return False
