"""The owner of a context's per-optimizer state: its windows, the ``step()`` running now, and the loop position.

As ``torch.amp.GradScaler`` keeps one record per optimizer, a :class:`~lightning_optimizer.reference.TrainingContext`
keeps one :class:`Windows`: a :class:`~.window.Window` per wrapped optimizer (in the order they were wrapped), the
:class:`~.call.Call` of the ``step()`` running now, and where the loop is (:class:`LoopPosition`, set by
``context.batch()``, the :class:`Batch` block). The context and its collaborators read the state through this
object's public members (the wrappers and the Lightning modules go through the context); the changes of stage are
the window's (:meth:`~.window.Window.move`), checked against one table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import NamedTuple

import torch

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.refusals import check_flag
from lightning_optimizer.reference.window import Window, WindowStage

__all__ = ["Batch", "LoopPosition", "Windows", "check_count"]


class LoopPosition(NamedTuple):
    """Where the loop is: the batch index within the epoch and whether it is the epoch's last batch."""

    batch_idx: int
    is_last: bool


def check_count(what: str, value: object) -> None:
    """Refuse a count that is not a non-negative ``int``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")


class Windows:
    """Every window of one context, the running call and the loop position.

    ``call`` and ``position`` are read by anyone and set only here: by :meth:`begin_call`/:meth:`end_call` and by a
    :class:`Batch` block (:attr:`position` is set on entering one and cleared on leaving it).
    """

    __slots__ = ("all", "call", "position")

    def __init__(self) -> None:
        self.all: list[Window] = []
        """The windows, one per wrapped optimizer, in the order they were wrapped (a wrapper's index is its place)."""
        self.call: Call | None = None
        """The ``step()`` running now (its closure, its preparation or its inner step), if any."""
        self.position: LoopPosition | None = None
        """Where the loop is while a ``context.batch()`` block runs; ``None`` outside one."""

    def __getstate__(self) -> list[Window]:
        # A copy carries the windows; it resumes outside any batch() and any step() (CKPT-004, PICKLE-001).
        return self.all

    def __setstate__(self, state: list[Window]) -> None:
        self.all, self.call, self.position = state, None, None

    def __len__(self) -> int:
        return len(self.all)

    def __iter__(self) -> Iterator[Window]:
        return iter(self.all)

    def __getitem__(self, index: int) -> Window:
        return self.all[index]

    def add(self, optimizer: torch.optim.Optimizer) -> int:
        """A window for ``optimizer``, wrapped now; its index."""
        self.all.append(Window(optimizer))
        return len(self.all) - 1

    def wraps(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether a window of this context is ``optimizer``'s."""
        return any(window.optimizer is optimizer for window in self.all)

    # -- the running call -------------------------------------------------------------------------------

    def begin_call(self, window: Window, *, real: bool) -> Call:
        """A ``step()`` of ``window`` begins; ``real``: it closes the window."""
        call = self.call = Call(window, real=real)
        return call

    def end_call(self) -> None:
        """The running ``step()`` returned or raised."""
        self.call = None

    # -- what the stages say ------------------------------------------------------------------------------

    def prepared(self, window: Window) -> bool:
        """Whether ``window`` is prepared for its real step: by ``unscale_gradients()``, or in the running call.

        The one place this is decided [CLIP-002].
        """
        if window.stage is WindowStage.PREPARED:
            return True
        call = self.call
        return call is not None and call.window is window and call.prepared

    def prepared_for_backward(self) -> bool:
        """Whether a backward now would add scaled gradients to a prepared window (not an evaluation's own)."""
        call = self.call
        if call is not None and call.prepared:
            return True
        for window in self.all:  # noqa: SIM110 (every backward asks: a loop, not a generator)
            if window.stage is WindowStage.PREPARED:
                return True
        return False

    def between_calls(self) -> bool:
        """No ``step()`` runs and no window is prepared: the windows are whole, as a state or a copy takes them."""
        return self.call is None and all(window.stage is WindowStage.READY for window in self.all)

    def holds_open_window(self) -> bool:
        """Whether any window holds accumulated micro-steps that its real step has not applied yet."""
        return any(window.length for window in self.all)


class Batch(AbstractContextManager[None]):
    """The block of ``context.batch(batch_idx, is_last=...)``: the loop position while it runs [STEP-003].

    Blocks do not nest [CTX-003]. Leaving it ends the training iteration (``end_iteration``: the loss scaler's update)
    [AMP-003]. (A class rather than a generator: it runs every iteration.)
    """

    __slots__ = ("batch_idx", "end_iteration", "is_last", "windows")

    def __init__(self, windows: Windows, batch_idx: int, is_last: object, end_iteration: Callable[[], None]) -> None:
        self.windows, self.batch_idx, self.is_last, self.end_iteration = windows, batch_idx, is_last, end_iteration

    def __enter__(self) -> None:
        if type(self.batch_idx) is not int or self.batch_idx < 0:  # the usual plain int skips the full check
            check_count("batch_idx", self.batch_idx)
        if type(self.is_last) is not bool:
            check_flag("is_last", self.is_last)
        windows = self.windows
        if windows.position is not None:
            raise RuntimeError("context.batch() blocks do not nest: leave the current batch first")
        windows.position = LoopPosition(self.batch_idx, self.is_last is True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.windows.position = None
        self.end_iteration()
