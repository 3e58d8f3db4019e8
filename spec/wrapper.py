"""The optimizer-wrapper contract: what ``opt`` is inside a user's ``training_step``.

A wrapper stands for one ``torch.optim.Optimizer`` (the *inner* optimizer) inside one training context (see
:mod:`lightning_optimizer.spec.context`). Every rule below carries a stable requirement id in brackets; the
conformance suite names the ids each check verifies.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, overload

import torch

from lightning_optimizer.spec.types import StepOutcome

__all__ = ["OptimizerWrapper"]

OptimizerT_co = TypeVar("OptimizerT_co", bound=torch.optim.Optimizer, covariant=True)
T = TypeVar("T")


class OptimizerWrapper(Protocol[OptimizerT_co]):
    """An optimizer that does the right thing for its training context when the user steps it by hand.

    Surface
        [SURFACE-001] A wrapper has every member declared here, each accepting every call that this protocol
        allows (checked at run time by signature and statically by mypy).

    Proxying
        [PROXY-001] ``isinstance(w, type(w.optimizer))`` and ``isinstance(w, torch.optim.Optimizer)`` hold.

        [PROXY-002] ``w.optimizer`` is the inner optimizer; ``param_groups``, ``state`` and ``defaults`` are
        the inner optimizer's own objects (identity, not copies).

        [PROXY-003] ``load_state_dict``, ``add_param_group`` and attribute assignment on the wrapper reach the
        inner optimizer; nothing is stored on the wrapper instead. One exception: the ``step`` that an LR
        scheduler built on the wrapper patches onto it stays on the wrapper (see SCHED-001), since moving it to
        the inner optimizer would make the two call each other.

        [PROXY-004] Step hooks registered through the wrapper (``register_step_pre_hook``,
        ``register_step_post_hook``) fire on every real step of that wrapper that is taken, and never on a call
        that only accumulates, on another wrapper's step, or on a step skipped for non-finite gradients (a fused
        optimizer's included, whose ``step`` torch's ``GradScaler`` would call with the found-inf).

        [PROXY-005] ``repr(w)`` names the inner optimizer's class.

    Schedulers, copies and checkpoints
        [SCHED-001] An LR scheduler can be built on the wrapper or on the inner optimizer; a real step of the
        wrapper, then the scheduler's step, raises no warning. After a call that only accumulated, the wrapper
        neither adds nor hides a warning: a scheduler built on the inner optimizer and stepped before that
        optimizer's first real step since the scheduler was built warns as torch warns; one built on the wrapper
        does not (the ``step`` it patched onto the wrapper counts every call).

        Rationale: stepping a per-step scheduler on every micro-step is the mistake torch's warning exists
        for (the learning rate would run ahead of the real steps); a wrapper that silenced it would hide that.

        [SCHED-002] A step skipped for non-finite gradients does not make a scheduler warn that
        ``lr_scheduler.step()`` ran before ``optimizer.step()``: a real step counts as the optimizer's step when it is
        made, taken or skipped, for a scheduler built on the wrapper or on the inner optimizer, also when another
        optimizer of the context only accumulates in the same iteration (whose schedulers warn as SCHED-001 says).
        The rule is stated by the warning; how torch tells that a step ran is torch's own.

        [PICKLE-001] ``pickle`` and ``copy.deepcopy`` of a wrapper, or of a whole training state (the context, the
        prepared model and the wrappers together), give working copies, independent of the original (training
        the copy changes nothing of the original, loss scaler included), that continue the same trajectory. A copy
        carries ``last_outcome``, and no hooks (HOOK-005).

        [CKPT-001] ``w.state_dict()`` is the inner optimizer's state dict, in the inner's own format.

    Several optimizers over one model
        [TOGGLE-001] While a wrapper's closure runs, and inside ``toggle_model()``, every parameter that
        belongs only to the context's other optimizers has ``requires_grad=False``.

        [TOGGLE-002] Every ``requires_grad`` flag is restored exactly afterwards, also when the closure or the
        block raises; a parameter the user froze stays frozen.
    """

    @property
    def optimizer(self) -> OptimizerT_co:
        """The inner optimizer. [PROXY-002]"""
        ...

    @property
    def last_outcome(self) -> StepOutcome | None:
        """What the last ``step()`` call did; ``None`` before the first call. [STEP-004]"""
        ...

    @overload
    def step(self, closure: None = None, make_optimizer_step: bool | None = None, **kwargs: Any) -> None: ...

    @overload
    def step(self, closure: Callable[[], T], make_optimizer_step: bool | None = None, **kwargs: Any) -> T: ...

    def step(
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        """Run one micro-step: the closure, then a real optimizer step or gradient accumulation.

        [STEP-001] ``make_optimizer_step=True``: the inner optimizer steps now, once, on the gradients of the
        window that this call closes.

        [STEP-002] ``make_optimizer_step=False``: the closure runs and gradients accumulate; parameters,
        optimizer state, loss-scaler state and step counts do not change.

        [STEP-003] ``make_optimizer_step=None``: the context's schedule decides. Inside a batch of the loop
        the call steps when ``(batch_idx + 1) % accumulate_grad_batches == 0`` or when the batch is the last
        of its epoch; outside any batch it steps when the window reaches ``accumulate_grad_batches``
        micro-steps.

        [STEP-004] After each call, ``last_outcome`` says whether it stepped, accumulated, or skipped the step
        because the gradients were not finite; it is the wrapper's own, read at any time, and calls of the
        context's other wrappers do not change it. It says what this wrapper's last call did, so it is not part of
        the context's state: ``None`` until the wrapper's first call, also after ``context.load_state_dict``
        (CKPT-002), which does not change it.

        [STEP-005] ``kwargs`` reach the inner optimizer's ``step`` on a real step.

        [STEP-006] The call returns the closure's result (``None`` without a closure): what its first evaluation
        returned, also when the inner optimizer evaluates it again, and whatever the inner ``step`` returns (another
        tensor, a number, ``None``, any object).

        Rationale: the result is then the same kind of value on every call of every optimizer, accumulating or
        not; torch's optimizers (LBFGS included) return that first result themselves, and a two-pass optimizer
        that returns something else does not change what the training loop sees.

        [ACC-001] A real step applies the mean of the micro-batch gradients of the window it closes, whatever
        the window's length (a full window, one cut short by ``make_optimizer_step=True``, or the last partial
        window of an epoch). ``k`` equal micro-batches thus equal one step on their concatenation with a mean
        loss.

        [ACC-002] The mean is the same whether the closure called ``w.backward(loss)`` or ``loss.backward()``
        (outside 16-mixed, where ``w.backward`` must scale).

        [ACC-003] The last partial window of an epoch is flushed by its last batch, never dropped and never
        carried into the next epoch (a window that ``make_optimizer_step=False`` keeps open at the last batch
        stays open, as asked).

        [ZERO-001] After a real step (taken or skipped), the gradients of the wrapper's parameters are
        ``None``; a context built with ``zero_grad_after_step=False`` leaves those of a taken step to the user's
        ``zero_grad()`` instead (ZERO-003 to ZERO-007).

        [CLOS-001] The closure runs exactly once per call, inside the autocast region of the context (a wrapper's
        ``backward`` in it leaves the region, BWD-002), except that on a real step the inner optimizer may evaluate
        it again, as often as it needs (CLOS-005).

        [CLOS-002] An optimizer that evaluates closures itself (torch's LBFGS, or one that declares it with a
        true ``evaluates_closure`` attribute, on the instance or its class) works in 64-true and 32-true; asking one
        to accumulate is refused with a ``ValueError``: by ``wrap`` when the context has
        ``accumulate_grad_batches > 1``, by ``step`` (before the closure runs) for ``make_optimizer_step=False``.
        Whatever declares it, every such optimizer is treated alike (CLOS-003, CLOS-004, FAIL-005, HOOK-002, AMP-005).
        It evaluates the loss its closure returns: a closure that returns ``None`` makes ``step`` raise
        ``TypeError`` saying that the closure must return the loss, and the call changes nothing (FAIL-005).

        [CLOS-005] On a real step outside 16-mixed, an inner optimizer whose ``step`` takes a ``closure`` gets
        one, as torch's optimizers expect. Its first call returns the call's closure's result without running
        it again: the closure has run, and its gradients are the window's, prepared (mean, reduction,
        clipping). Each further call evaluates the closure anew, as CLOS-004 says (gradients set to ``None``
        first, toggled, reduced, clipped), inside the context's autocast region as the first evaluation ran
        (CLOS-001; its backward outside it, BWD-002), so a two-pass optimizer (SAM-style: a step at perturbed
        parameters) gets the gradients of its second point, in the precision of its first. Under 16-mixed the inner
        ``step`` gets no closure: torch's ``GradScaler.step`` takes none, so the closure runs once, before the step.
        A ``step`` takes a closure when ``step(closure=...)`` binds to its signature (a parameter named
        ``closure``, or ``**kwargs``). A call without a closure hands the inner ``step`` none: it is called
        without a ``closure`` argument, as ``optimizer.step()`` is, never with ``closure=None`` or a closure of
        the wrapper's own.

        [CLOS-003] A closure that raises propagates its exception; nothing is stepped and every ``requires_grad``
        flag is restored. The window is what the context's failure policy makes of it (FAIL-002 to FAIL-004): as
        it was before the call, gradients included, when no backward of the call wrote into it, and under
        ``on_failure="restore"`` whatever the closure did (a backward the closure ran before raising adds nothing
        to the window); discarded otherwise. For an optimizer that evaluates the closure itself (CLOS-002), a step
        that fails (whichever evaluation raises, or the inner step raising on what the closure returned, e.g.
        ``None`` where LBFGS needs a loss) leaves its parameters, gradients and state as they were before the
        call, under either policy (FAIL-005). An optimizer that re-evaluates without declaring it gets its
        gradients back under ``"restore"`` when a later evaluation raises, but parameters it moved before that are
        its own to restore.

        [CLOS-004] For an optimizer that evaluates the closure itself, the gradients of its parameters are set
        to ``None`` before each evaluation that it makes: each evaluation's gradients are its own backward's,
        whether the closure zeroes them (as torch's LBFGS documentation asks) or not (as closures written for
        Lightning's automatic optimization do not).

        [ERR-001] A closure that is not callable raises ``TypeError`` before anything runs, whatever else the
        call or the window's stage would refuse.

        [ERR-002] A ``make_optimizer_step`` that is not ``bool`` or ``None`` raises ``TypeError`` before
        anything runs.

        [ERR-008] Keyword arguments that the inner optimizer's ``step`` cannot take (checked against its signature)
        raise ``TypeError`` before anything runs, on a call that only accumulates too.

        [TXN-001] A real step whose inner ``step`` (or the window's preparation) raises propagates the exception.
        Under ``on_failure="restore"`` it leaves the window as it was before the call: its gradients (not
        averaged, unscaled or clipped, and without the gradients of this call's closure), its length, whether
        ``unscale_gradients()`` had prepared it, ``last_outcome``, the step count and the loss scaler; retrying
        the call then applies the window's true mean. Under ``"discard"`` the window is discarded (FAIL-003).
        (The inner optimizer's own parameters and state are its own: what it changed before it raised is not
        undone, except for an optimizer that evaluates the closure itself, CLOS-003.)

        [REENT-001] A ``step()`` called while a ``step()`` of the same context runs (from inside a closure, of the
        same wrapper or another) raises ``RuntimeError`` and changes nothing. The refusal is the closure's to
        handle: left to propagate, it fails the outer call as a raising closure does (CLOS-003); caught by the
        closure, the outer call goes on as if the inner call had not been made.
        """
        ...

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` for this wrapper's training context.

        [BWD-001] Equivalent to ``loss.backward(*args, **kwargs)`` (``gradient``, ``retain_graph``,
        ``create_graph`` and ``inputs`` are forwarded) except that under 16-mixed the loss is scaled by the
        context's loss scaler first (AMP-007).

        [BWD-002] Autograd, and the backward hooks around it (HOOK-001), run with autocast disabled on the
        context's device, wherever ``backward`` is called: in a closure (which runs inside the context's autocast
        region, CLOS-001), inside ``context.autocast()`` (a GAN iteration in one region), or inside a region the
        user opened; the forward passes stay where the user ran them. The gradients are then those of torch's
        recipe, which runs backward passes outside autocast. A plain ``loss.backward()`` runs where it is called.

        Rationale: under autocast the backward's own ops are autocast too; the backward of a float32 block (one
        the forward ran with autocast disabled, or a create_graph backward) then computes in the low precision.
        """
        ...

    def unscale_gradients(self) -> None:
        """Prepare the open window for its real step now, so that the user can inspect or clip its gradients.

        [CLIP-002] The window's gradients become what the real step will apply: their mean, reduced across XLA
        replicas, unscaled under 16-mixed, clipped when the context clips; the ``step()`` that closes the window
        then repeats none of it (no double unscale). A ``step()`` that would not close the window after this
        call raises ``RuntimeError`` and changes nothing, and so does a ``backward()`` of any wrapper of the
        context before that step, over the same parameters or others (it would add scaled gradients to prepared
        ones; one rule for every wrapper, so that the order is the user's to follow and not the graph's), except in
        the evaluations that the closing step's inner optimizer makes itself (CLOS-005, CLOS-002); so does this call
        made inside
        the closure of a ``step()`` that does not close the window (call it in the closure of the closing step,
        or between the window's last backward and that step). A ``zero_grad()`` after this call, before the
        closing step, raises ``RuntimeError`` and changes nothing: it would discard gradients that cannot be
        prepared again in the same iteration (the loss scaler unscales an optimizer once per iteration). A second
        call before the closing step does nothing: a window is prepared once; so does a call in an evaluation that
        the closing step's inner optimizer makes (CLOS-005), which the context prepares itself. The mean divides
        by the window's full length: the micro-steps it accumulated and the closing one, whose backward runs in
        the closing step's closure or before that ``step()`` (``k + 1`` after ``k`` accumulating calls, fewer when
        the window is cut short). A call that fails follows the context's failure policy (FAIL-007).
        """
        ...

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients of this wrapper's parameters, unless a window is open.

        [ZERO-002] While a window is open (micro-steps accumulated since the last real step) the call does
        nothing, so the ``zero_grad(); backward(); step()`` loop stays correct under accumulation; otherwise it
        clears them as the inner optimizer's ``zero_grad(set_to_none)`` does, the gradients a window carries
        included (ZERO-005). After ``unscale_gradients()`` and before the closing step it raises instead
        (CLIP-002).
        """
        ...

    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        """Context manager: only this wrapper's parameters require grad inside the block.

        [TOGGLE-003] ``sync_grad=False`` runs the block under the gradient-sync suppression of every
        distributed module of the context (``DistributedDataParallel.no_sync``); this is what the
        backward-then-step form needs on the micro-steps that do not close a window.

        [ERR-009] A ``sync_grad`` here, or an ``is_last`` of ``context.batch()``, that is not a ``bool`` raises
        ``TypeError`` before anything changes (a truthy object is not read as a flag).
        """
        ...

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's ``param_groups`` list. [PROXY-002]"""
        ...

    @property
    def state(self) -> Any:
        """The inner optimizer's ``state`` mapping. [PROXY-002]"""
        ...

    @property
    def defaults(self) -> dict[str, Any]:
        """The inner optimizer's ``defaults``. [PROXY-002]"""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict, unchanged in format. [CKPT-001]"""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the inner optimizer.

        [ERR-005] A state dict for another parameter layout raises ``ValueError`` and leaves the inner
        optimizer's state unchanged. The layout is what ``torch.optim.Optimizer.load_state_dict`` compares: the
        number of parameter groups and the number of parameters in each. A state that torch loads, state tensors
        of other shapes included (torch finds those only when it steps), the wrapper loads as torch does. A state
        that is not a ``dict`` raises ``TypeError``, and one without the keys ``"state"`` and ``"param_groups"``
        raises ``ValueError`` naming the missing keys, both before anything changes; an inner optimizer that
        overrides ``load_state_dict`` reads its own format and decides. A load that raises halfway leaves the
        inner optimizer's ``state`` and ``param_groups`` as they were before the call (FAIL-008).
        """
        ...

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the inner optimizer. [PROXY-003] [ERR-007] [WIN-001] [FAIL-008]

        The new group's parameters are the wrapper's from then on: they are toggled, accumulated, normalised,
        unscaled, clipped, zeroed and checkpointed like the others. With the wrapper's window open it raises
        ``RuntimeError`` before the inner optimizer changes (WIN-001); one that fails leaves ``param_groups`` as it
        was (FAIL-008).
        """
        ...
