"""One ``step()`` call as an explicit stage machine, as ``torch.amp.GradScaler`` keeps one per optimizer.

A call that accumulates runs ``CLOSURE`` then ``DONE``; a real step ``CLOSURE``, ``PREPARED`` (the window's mean,
reduction, unscaling and clipping, :mod:`.preparation`), ``STEPPING`` (the inner optimizer's step, which may
evaluate the closure again, ``REEVALUATING``), ``DONE``. A window that ``unscale_gradients()`` prepared before the
call starts its closing call at ``PREPARED``; ``unscale_gradients()`` inside the closure of a closing call moves
it there from ``CLOSURE``. Any stage may end in ``FAILED``, whose effect the failure policy decides
(:mod:`.failure`). Each transition is checked: one the machine does not allow is a bug of the reference, raised as
such.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from lightning_optimizer.reference.window import Window, WindowStage

if TYPE_CHECKING:
    from lightning_optimizer.reference.failure import Transaction
    from lightning_optimizer.reference.zeroing import Taking

__all__ = ["Call", "CallStage"]


class CallStage(enum.Enum):
    """Where one ``step()`` call is."""

    CLOSURE = "closure"
    """The user's closure runs (a call without one passes through with nothing to run)."""
    PREPARED = "prepared"
    """A real step's window is what the inner step applies: prepared once, in this call or before it."""
    STEPPING = "stepping"
    """The inner optimizer's step runs."""
    REEVALUATING = "reevaluating"
    """The inner optimizer evaluates the closure again (a two-pass optimizer, CLOS-005)."""
    DONE = "done"
    FAILED = "failed"

    __hash__ = object.__hash__  # members are singletons compared by identity: a C-level hash for _NEXT's lookups


_NEXT: dict[CallStage, frozenset[CallStage]] = {
    CallStage.CLOSURE: frozenset({CallStage.PREPARED, CallStage.STEPPING, CallStage.DONE, CallStage.FAILED}),
    CallStage.PREPARED: frozenset({CallStage.STEPPING, CallStage.FAILED}),
    CallStage.STEPPING: frozenset({CallStage.REEVALUATING, CallStage.DONE, CallStage.FAILED}),
    CallStage.REEVALUATING: frozenset({CallStage.STEPPING, CallStage.FAILED}),
    CallStage.DONE: frozenset(),
    CallStage.FAILED: frozenset(),
}
"""The transitions a call may take (``CLOSURE`` to ``STEPPING``: an optimizer that evaluates its closure itself)."""


class Call:
    """One ``step()`` call of ``window``: its stage, and whether it closes the window (``real``)."""

    __slots__ = (
        "prepared",
        "prepared_before",
        "real",
        "skipped",
        "stage",
        "stage_before",
        "taking",
        "transaction",
        "window",
    )

    def __init__(self, window: Window, *, real: bool) -> None:
        self.window = window
        self.real = real
        self.stage_before = window.stage
        """The window's stage before the call (what a failed call that changed nothing puts back)."""
        self.prepared_before = window.stage is WindowStage.PREPARED
        """``unscale_gradients()`` prepared the window before this call."""
        self.stage = CallStage.PREPARED if self.prepared_before else CallStage.CLOSURE
        self.prepared = self.prepared_before
        """The window is prepared for the real step (before this call, or in it); an evaluation's are its own.

        Kept by :meth:`advance` (every backward asks it): the stage is ``PREPARED`` or ``STEPPING``."""
        self.skipped = False
        """The loss scaler skipped the real step for non-finite gradients."""
        self.transaction: Transaction
        """The failure policy's transaction of this call (set when the call begins)."""
        self.taking: Taking | None = None
        """What the window held before this call took its carried part (``zero_grad_after_step=False``), if it did."""
        window.move(WindowStage.CLOSING if real else WindowStage.ACCUMULATING)

    def advance(self, to: CallStage) -> None:
        """Move to ``to``; a transition the machine does not allow is the reference's own bug."""
        if to not in _NEXT[self.stage]:
            raise AssertionError(f"a step() call cannot go from {self.stage.value} to {to.value}")
        self.stage = to
        self.prepared = to is CallStage.PREPARED or to is CallStage.STEPPING

    @property
    def reached_the_step(self) -> bool:
        """The call prepared the window itself, or got to the inner step: a failure now is the real step's."""
        return self.prepared_here or self.stage is CallStage.STEPPING or self.stage is CallStage.REEVALUATING

    @property
    def prepared_here(self) -> bool:
        """Whether the window was prepared in this call (the loss scaler recorded its unscaling in this call)."""
        return self.prepared and not self.prepared_before
