"""What a failed ``step()`` leaves of its window: the two failure policies, one transaction protocol [FAIL-001].

Every call runs in a :class:`Transaction` that its context's policy begins. The context tells the transaction
what happens to the window: the closure is about to run, the window is about to change in place (the
preparation), the closure returned, the closure cleared an empty window; then the call commits or fails.

- :class:`Discard` (the default) keeps nothing: a failed call that wrote into the window (a backward, the
  preparation, the inner step) discards it, one that did not changes nothing [FAIL-002, FAIL-003]. It tells the two
  apart from the gradients themselves: which went from ``None`` to a tensor, whose version counter moved.
- :class:`Restore` keeps what it needs to put the window back exactly [FAIL-004, CLOS-003, TXN-001]: before the
  closure the window's gradients are moved aside (the *stash*) and the closure's backward writes fresh ones; on
  success the stash is added into them (one in-place add, the work autograd does when it accumulates), on failure it
  is put back. Where a backward must see the window itself (DDP reduces the accumulated sum in the closing
  backward), or where the window is prepared in place with no stash to return to, it is copied first.
- An optimizer that evaluates its closure itself moves parameters and state between evaluations: under either
  policy :class:`ParameterRollback` copies them and puts them back [FAIL-005].
- ``unscale_gradients()`` between calls prepares the window in a :class:`PreparationTransaction` of the policy: a
  failure discards the window, or puts it back exactly [FAIL-007].
- A wrapper's ``backward()`` outside ``step()`` runs in a :class:`BackwardTransaction` over every window, since
  autograd writes into any the loss reaches: a failure discards those it wrote into, or puts all back [FAIL-008].
- ``add_param_group`` and ``load_state_dict`` of a wrapper keep an :class:`OptimizerSnapshot` (the inner optimizer's
  own objects, no tensor copied), put back if the inner call raises [FAIL-008].
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Protocol

import torch

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec.types import FAILURE_POLICIES, FailurePolicy

__all__ = [
    "NOTHING_TO_UNDO",
    "BackwardTransaction",
    "Discard",
    "FailurePolicyRule",
    "NothingToUndo",
    "OptimizerSnapshot",
    "ParameterRollback",
    "PreparationTransaction",
    "Restore",
    "Transaction",
    "discard_note",
    "failure_policy",
]


class Transaction(Protocol):
    """One call's transaction over the tensors whose ``.grad`` is the window (its parameters, FSDP's unsynced)."""

    def before_in_place(self, call: Call) -> None:
        """The window is about to change in place: its preparation, or a backward into an unstashed window."""
        ...

    def after_closure(self, call: Call) -> None:
        """The closure returned: the window is its gradients and the closure's."""
        ...

    def cleared(self, set_to_none: bool) -> None:
        """The closure cleared the gradients of an empty window (``zero_grad()``)."""
        ...

    def commit(self) -> None:
        """The call succeeded: nothing kept for a failure is needed any more."""
        ...

    def fail(self, call: Call) -> bool:
        """The call raised: put the window back, or discard it; ``True`` when it was discarded."""
        ...


class FailurePolicyRule(Protocol):
    """A failure policy: the transactions it begins, and its name (what ``context.on_failure`` reads)."""

    name: FailurePolicy

    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        """The transaction of ``call`` over ``tensors``; ``stash``: the closure's backward may start from nothing."""
        ...

    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        """The transaction of ``unscale_gradients()`` between calls; ``changes``: the preparation writes in place."""
        ...

    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        """The transaction of a wrapper's ``backward()`` outside ``step()``, over every window's tensors."""
        ...


class NothingToUndo:
    """The transaction of a call that runs no closure and does not close its window: it writes nothing to undo."""

    __slots__ = ()

    def before_in_place(self, call: Call) -> None:
        """Nothing changes in place: no closure, no preparation."""

    def after_closure(self, call: Call) -> None:
        """No closure ran."""

    def cleared(self, set_to_none: bool) -> None:
        """No closure cleared anything."""

    def commit(self) -> None:
        """Nothing was kept."""

    def fail(self, call: Call) -> bool:
        """The window is as it was: nothing wrote into it."""
        return False


NOTHING_TO_UNDO = NothingToUndo()
"""The one transaction of every call without a closure that does not close its window (the direct form's
micro-steps), under either policy."""


def failure_policy(name: object) -> FailurePolicyRule:
    """The policy named ``name``; a ``ValueError`` names the valid ones otherwise [FAIL-001]."""
    if name == "discard":
        return Discard()
    if name == "restore":
        return Restore()
    raise ValueError(f"on_failure must be one of {', '.join(map(repr, FAILURE_POLICIES))}, got {name!r}")


def discard_note(window: Window, *, carried: bool = False) -> str:
    """The note a discarded window's exception carries: what was lost, and how to keep it [FAIL-003, ZERO-007].

    ``carried``: the window also carried the gradients of the last real step (``zero_grad_after_step=False``).
    """
    also = " and the gradients it carried from the last real step" if carried else ""
    return (
        f"on_failure='discard': the window of {type(window.optimizer).__name__} was discarded with its "
        f"{window.length + 1} micro-step(s){also}; build the TrainingContext with on_failure='restore' to keep a "
        "failed call's window"
    )


# -- discard -----------------------------------------------------------------------------------------------


class Discard:
    """Keep nothing; a failed call that wrote into its window discards the window [FAIL-002, FAIL-003]."""

    name: FailurePolicy = "discard"

    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        """A transaction that only notes what each gradient is now (no copy, no stash) [FAIL-003].

        An optimizer that evaluates its closure itself is restored exactly all the same [FAIL-005].
        """
        if call.window.evaluates_closure and call.real:
            return ParameterRollback(call.window.optimizer)
        return DiscardTransaction(tensors)

    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        """Keep nothing: a preparation that fails discards the window [FAIL-007]."""
        return PreparationTransaction(tensors, keep=False)

    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        """Note each gradient: a backward that fails discards the windows it wrote into [FAIL-008]."""
        return BackwardTransaction(windows, keep=False)


class DiscardTransaction:
    __slots__ = ("grads", "tensors", "versions")

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tensors
        self.grads = [tensor.grad for tensor in tensors]
        self.versions = torch_compat.version_counters(self.grads)

    def before_in_place(self, call: Call) -> None:
        """Nothing to keep."""

    def after_closure(self, call: Call) -> None:
        """Nothing to merge: the closure's backward wrote into the window itself."""

    def cleared(self, set_to_none: bool) -> None:
        """Nothing to forget."""

    def commit(self) -> None:
        """Nothing was kept."""

    def written(self) -> bool:
        """Whether any gradient of the window changed since the call began (a new tensor, or written in place)."""
        for tensor, grad, version in zip(self.tensors, self.grads, self.versions, strict=True):
            now = tensor.grad
            if now is not grad or (now is not None and torch_compat.version_counter(now) != version):
                return True
        return False

    def fail(self, call: Call) -> bool:
        """Discard the window if the call wrote into it or reached its real step; else it is as it was."""
        if not (self.written() or call.reached_the_step):
            return False
        for tensor in self.tensors:
            tensor.grad = None
        return True


# -- restore -----------------------------------------------------------------------------------------------


class Restore:
    """Keep what puts the window back exactly: one extra gradient set while a call runs [FAIL-004]."""

    name: FailurePolicy = "restore"

    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        """A transaction that stashes the window before the closure (``stash``), or copies it before it changes."""
        if call.window.evaluates_closure and call.real:
            return ParameterRollback(call.window.optimizer)
        return RestoreTransaction(tensors, stash=stash, in_place=in_place, real=call.real)

    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        """Copy the window's gradients first when the preparation changes them in place [FAIL-007]."""
        return PreparationTransaction(tensors, keep=True, copy=changes)

    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        """Copy every window's gradients: a backward that fails puts all of them back [FAIL-008]."""
        return BackwardTransaction(windows, keep=True)


class RestoreTransaction:
    """The window moved aside (or copied) before it changes, put back if the call fails."""

    __slots__ = ("before", "cleared_empty", "in_place", "kept", "merged", "real", "stashed", "tensors", "zeros")

    def __init__(self, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool, real: bool) -> None:
        self.tensors = tensors
        self.in_place, self.real = in_place, real
        self.before: list[torch.Tensor | None] = [tensor.grad for tensor in tensors]
        holds = any(grad is not None for grad in self.before)
        self.stashed = stash and holds
        """The window's gradients are set aside; the closure's backward starts from none."""
        self.kept = self.stashed or not holds
        """``before`` is what the window was, safe from in-place changes (set aside, copied, or all ``None``)."""
        self.merged = not self.stashed
        self.cleared_empty = self.zeros = False
        if self.stashed:
            for tensor in tensors:
                tensor.grad = None

    def before_in_place(self, call: Call) -> None:
        """Copy the window's gradients (once) before they change in place, unless they are set aside."""
        if not self.kept:
            self.before = [None if grad is None else grad.detach().clone() for grad in self.before]
            self.kept = True

    def cleared(self, set_to_none: bool) -> None:
        """The closure cleared an empty window: the stash is not added back."""
        if self.stashed and not self.merged:
            self.cleared_empty, self.zeros = True, not set_to_none

    def after_closure(self, call: Call) -> None:
        """Add the stashed window into the closure's fresh gradients (once); the stash stays for :meth:`fail`."""
        if self.merged:
            return
        self.merged = True
        for tensor, old in zip(self.tensors, self.before, strict=True):
            if old is not None:
                tensor.grad = self.merged_grad(tensor.grad, old)

    def merged_grad(self, fresh: torch.Tensor | None, old: torch.Tensor) -> torch.Tensor | None:
        if self.cleared_empty:
            return torch.zeros_like(old) if fresh is None and self.zeros else fresh
        if fresh is None:
            # The window's sum is prepared in place on a real step: the stash must stay untouched.
            return old.clone() if self.real else old
        if self.in_place and not (fresh.is_sparse or old.is_sparse or fresh.requires_grad):
            return fresh.add_(old)
        return fresh + old  # keeps the graph of a create_graph backward, as autograd would

    def commit(self) -> None:
        """Drop the stash or copy."""
        self.before = []

    def fail(self, call: Call) -> bool:
        """Put the window back as it was before the call."""
        for tensor, grad in zip(self.tensors, self.before, strict=True):
            tensor.grad = grad
        return False


# -- unscale_gradients() between calls ----------------------------------------------------------------------


class PreparationTransaction:
    """``unscale_gradients()`` between calls: the window's preparation, kept (``keep``) or discarded if it fails.

    The preparation writes into the window from its first step (the mean, then the unscaling, the clipping), so a
    failure halfway leaves gradients that are neither the window nor its preparation: a restoring policy copies them
    first (``copy``: the preparation changes them in place; otherwise the tensors themselves are what the window
    was), a discarding one clears them [FAIL-007].
    """

    __slots__ = ("before", "keep", "tensors")

    def __init__(self, tensors: Sequence[torch.Tensor], *, keep: bool, copy: bool = False) -> None:
        self.tensors, self.keep = tensors, keep
        grads = [tensor.grad for tensor in tensors]
        self.before = [None if grad is None else grad.detach().clone() for grad in grads] if copy else grads

    def commit(self) -> None:
        """The window is prepared: drop the copy."""
        self.before = []

    def fail(self) -> bool:
        """Put the window's gradients back (``keep``), or clear them; ``True`` when the window was discarded."""
        for tensor, grad in zip(self.tensors, self.before, strict=True):
            tensor.grad = grad if self.keep else None
        return not self.keep


# -- a wrapper's backward outside step() -------------------------------------------------------------------


class BackwardTransaction:
    """A wrapper's ``backward()`` outside ``step()``: every window kept (``keep``), or those it wrote discarded.

    Autograd accumulates into the gradients in place or replaces them; either way a window it wrote into is told
    from its gradients (a new tensor, a moved version counter), as :class:`DiscardTransaction` tells it. A restoring
    policy copies every window's gradients first and writes the copies back into the same tensors, which DDP's
    bucket views and the loss scaler's records keep referring to [FAIL-008].
    """

    __slots__ = ("copies", "grads", "keep", "versions", "windows")

    def __init__(self, windows: Sequence[Sequence[torch.Tensor]], *, keep: bool) -> None:
        self.windows, self.keep = windows, keep
        self.grads = [[tensor.grad for tensor in tensors] for tensors in windows]
        self.versions = [torch_compat.version_counters(grads) for grads in self.grads]
        self.copies = (
            [[None if grad is None else grad.detach().clone() for grad in grads] for grads in self.grads]
            if keep
            else []
        )

    def commit(self) -> None:
        """The backward returned: drop what was kept."""
        self.grads, self.copies = [], []

    def written(self, index: int) -> bool:
        """Whether the backward wrote into window ``index`` (a gradient replaced, created, or written in place)."""
        for tensor, grad, version in zip(self.windows[index], self.grads[index], self.versions[index], strict=True):
            now = tensor.grad
            if now is not grad or (now is not None and torch_compat.version_counter(now) != version):
                return True
        return False

    def fail(self) -> list[int]:
        """Put every window back (``keep``), or discard those written; the indices of the discarded ones."""
        if self.keep:
            with torch.no_grad():
                for tensors, grads, copies in zip(self.windows, self.grads, self.copies, strict=True):
                    for tensor, grad, kept in zip(tensors, grads, copies, strict=True):
                        if grad is not None and kept is not None:
                            grad.copy_(kept)
                        tensor.grad = grad
            return []
        discarded = [index for index in range(len(self.windows)) if self.written(index)]
        for index in discarded:
            for tensor in self.windows[index]:
                tensor.grad = None
        return discarded


class OptimizerSnapshot:
    """What ``add_param_group`` and ``load_state_dict`` change of an inner optimizer, to put back if they raise.

    Torch replaces ``state`` and ``param_groups`` on a load and appends to ``param_groups``; the snapshot keeps those
    objects and a shallow copy of their entries (no tensor is copied), so an override that edits them in place is put
    back too [FAIL-008].
    """

    __slots__ = ("entries", "group_entries", "groups", "optimizer", "state")

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.state = optimizer.state
        self.entries = dict(optimizer.state)
        self.groups = optimizer.param_groups
        self.group_entries = [(group, dict(group)) for group in optimizer.param_groups]

    def restore(self) -> None:
        """The optimizer's ``state`` and ``param_groups`` as they were: the same objects, the same entries."""
        self.state.clear()
        self.state.update(self.entries)
        for group, entries in self.group_entries:
            group.clear()
            group.update(entries)
        self.groups[:] = [group for group, _ in self.group_entries]
        self.optimizer.state = self.state
        self.optimizer.param_groups = self.groups


# -- closure evaluators --------------------------------------------------------------------------------------


class ParameterRollback:
    """The transaction of an optimizer that evaluates its closure itself: parameters, gradients, state [FAIL-005].

    LBFGS moves the parameters between evaluations and creates its state before the first one; a failed step
    puts all of it back, under either policy.
    """

    __slots__ = ("grads", "optimizer", "params", "state", "values")

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.params = [param for group in optimizer.param_groups for param in group["params"]]
        self.values = [param.detach().clone() for param in self.params]
        self.grads = [None if param.grad is None else param.grad.detach().clone() for param in self.params]
        self.state = {param: copy.deepcopy(entry) for param, entry in optimizer.state.items()}

    def before_in_place(self, call: Call) -> None:
        """Everything is copied already."""

    def after_closure(self, call: Call) -> None:
        """Each evaluation's gradients are its own (CLOS-004): nothing to merge."""

    def cleared(self, set_to_none: bool) -> None:
        """Nothing to forget."""

    def commit(self) -> None:
        """Drop the copies."""
        self.values, self.grads, self.state = [], [], {}

    def fail(self, call: Call) -> bool:
        """Put parameters, gradients and state back."""
        with torch.no_grad():
            for param, value, grad in zip(self.params, self.values, self.grads, strict=True):
                param.copy_(value)
                param.grad = grad
        self.optimizer.state.clear()
        self.optimizer.state.update(self.state)
        return False
