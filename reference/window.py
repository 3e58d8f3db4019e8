"""One optimizer's accumulation window: its stage, and the transaction that one ``step()`` call runs in.

Stages and transitions (each checked in :class:`~lightning_optimizer.reference.TrainingContext` where it can
break; the error says what to call instead)::

    READY --step() that does not close--> ACCUMULATING --closure returns--> READY (one micro-step longer)
    READY --unscale_gradients()---------> PREPARED
    READY or PREPARED --closing step()--> CLOSING --inner step returns--> READY (empty, counted)
    ACCUMULATING or CLOSING --raises----> the stage before the call, the window as it was

    refused: a step() that does not close a PREPARED window; zero_grad() or backward() of a PREPARED window;
    unscale_gradients() inside an ACCUMULATING closure; any step() while another step() of the context runs.

A call does not copy the window to be able to undo itself. Before the closure runs, the window's gradient tensors
are moved aside (the *stash*) and the closure's backward writes fresh ones; on success the stash is added into
them (one in-place add, the work autograd does when it accumulates), on failure the stash is put back. Only where
a backward must see the window itself (DDP reduces the accumulated sum in the closing backward), or where the
window is prepared in place with no stash to return to (``step()`` without a closure), is the window copied first.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lightning_optimizer.spec.types import StepOutcome

__all__ = ["StepCall", "Window", "WindowStage", "evaluates_closure", "takes_closure"]


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
    """Between calls: the window holds ``pending`` accumulated micro-steps (none after a real step)."""
    PREPARED = "prepared"
    """``unscale_gradients()`` made the gradients what the real step applies: only the closing step may follow."""
    ACCUMULATING = "accumulating"
    """The closure of a ``step()`` that does not close the window is running."""
    CLOSING = "closing"
    """A ``step()`` that closes the window is running: its closure, the preparation or the inner step."""


@dataclass
class Window:
    """What the context keeps for one wrapped optimizer."""

    optimizer: torch.optim.Optimizer
    pending: int = 0
    """Micro-steps accumulated since the last real step (the open window's length)."""
    steps: int = 0
    """Real steps taken."""
    last_outcome: StepOutcome | None = None
    stage: WindowStage = WindowStage.READY
    skipped: bool = False
    """The real step in progress was skipped for non-finite gradients."""
    evaluates_closure: bool = field(init=False)
    """The optimizer declares that its ``step`` evaluates the closure itself (LBFGS)."""
    takes_closure: bool = field(init=False)
    """The optimizer's ``step`` takes a ``closure``: a real step hands it one."""

    def __post_init__(self) -> None:
        self.evaluates_closure = evaluates_closure(self.optimizer)
        self.takes_closure = takes_closure(self.optimizer)

    def params(self) -> list[torch.Tensor]:
        """The optimizer's parameters, every group, in order (read each time: groups can be added)."""
        return [param for group in self.optimizer.param_groups for param in group["params"]]

    def has_gradients(self) -> bool:
        """Whether any of the parameters has a gradient."""
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    return True
        return False


class StepCall:
    """One ``step()`` call of a window: what it needs to put the window back if it fails.

    ``stash=True`` moves the window's gradients aside before the closure (see the module docstring); otherwise
    they stay in place and :meth:`protect` copies them before anything changes them. ``in_place=False`` merges
    into a new tensor instead of the fresh gradient (XLA, where an in-place add on some gradients is not safe).
    ``unsynced`` are further tensors whose ``.grad`` belongs to the window: under FSDP, the unsharded parameters
    that micro-steps without sync accumulate into (:mod:`.fsdp`).
    """

    def __init__(
        self,
        window: Window,
        *,
        real: bool,
        stash: bool,
        in_place: bool = True,
        unsynced: Sequence[torch.Tensor] = (),
    ) -> None:
        self.window = window
        self._in_place = in_place
        self.real = real
        self.stage_before = window.stage
        self.prepared = window.stage is WindowStage.PREPARED
        """The window is prepared for its real step (before the call, or by ``unscale_gradients()`` inside it)."""
        self.unscaled_here = False
        """This call unscaled the window (the loss scaler has to forget it if the call fails)."""
        self.reevaluating = False
        """The inner optimizer is evaluating the closure again (a two-pass optimizer) [CLOS-005]."""
        self._params = params = window.params() + list(unsynced) if unsynced else window.params()
        self._before: list[torch.Tensor | None] = [param.grad for param in params]
        holds = False
        for grad in self._before:
            if grad is not None:
                holds = True
                break
        self._stashed = stash and holds
        self._protected = self._stashed or not holds  # nothing to protect: every gradient is None
        self._merged = not self._stashed
        self._cleared = False
        if self._stashed:
            for param in params:
                param.grad = None
        window.stage = WindowStage.CLOSING if real else WindowStage.ACCUMULATING

    def protect(self) -> None:
        """Copy the window's gradients (once) before they change in place, unless they are stashed."""
        if not self._protected:
            self._before = [None if grad is None else grad.detach().clone() for grad in self._before]
            self._protected = True

    def clear(self, set_to_none: bool) -> None:
        """The closure cleared the gradients of an empty window (``zero_grad()``): the stash is not added back."""
        if self._stashed and not self._merged:
            self._cleared = True
            self._zeros = not set_to_none

    def merge(self) -> None:
        """Add the stashed window into the closure's fresh gradients (once); the stash stays for :meth:`rollback`."""
        if self._merged:
            return
        self._merged = True
        for param, old in zip(self._params, self._before, strict=True):
            if old is None:
                continue
            fresh = param.grad
            if self._cleared:
                if fresh is None and self._zeros:
                    param.grad = torch.zeros_like(old)
            elif fresh is None:
                # The window's sum is prepared in place on a real step: the stash must stay untouched.
                param.grad = old.clone() if self.real else old
            elif self._in_place and not (fresh.is_sparse or old.is_sparse or fresh.requires_grad):
                fresh.add_(old)
            else:
                param.grad = fresh + old  # keeps the graph of a create_graph backward, as autograd would

    def rollback(self) -> None:
        """Put the window back as it was before the call."""
        for param, grad in zip(self._params, self._before, strict=True):
            param.grad = grad
        self.window.stage = self.stage_before
        self.window.skipped = False

    def commit(self) -> None:
        """The call succeeded: the window's stage is READY again."""
        self.window.stage = WindowStage.READY
        self._before = []
