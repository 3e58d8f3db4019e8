"""The training context: what several wrappers over one model share.

A training context owns the precision, the device, the accumulation schedule, the loss scaler and the loop
position. A framework (or a plain loop) creates one, prepares the model with it, wraps each optimizer with it,
runs forward passes under its autocast, and tells it where the loop is.

Non-normative: in a framework's own loop, the context sits where the framework decides precision, device and
loop position. The reference joins Lightning's ``Trainer.fit`` as a strategy
(``lightning_optimizer.reference.lightning`` for ``lightning.pytorch``,
``lightning_optimizer.reference.pytorch_lightning`` for ``pytorch_lightning``), not as a callback or a module base
class: Lightning fixes the precision while the ``Trainer`` is built, and on the CPU replaces 16-mixed by bf16-mixed
unless the strategy brings its own precision plugin. The strategy is also where the context's other duties sit in
Lightning: the precision plugin (autocast and loss scaling applied once), the loop position (one ``batch`` per
training step), the DDP wrapper and its preparation before each backward. Its ``connect`` hook runs before Lightning
refuses accumulation and clipping under manual optimization, so those ``Trainer`` arguments reach the context.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeAlias, TypeVar

import torch

from lightning_optimizer.spec.types import FailurePolicy, Precision, StepOutcome
from lightning_optimizer.spec.wrapper import OptimizerWrapper

__all__ = ["BackwardHook", "HookHandle", "OptimizerStepHook", "StepHook", "TrainingContext"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

BackwardHook: TypeAlias = Callable[[OptimizerWrapper[Any], torch.Tensor], None]
"""``hook(wrapper, loss)``: around a wrapper's ``backward(loss)`` (the loss as passed, unscaled)."""
OptimizerStepHook: TypeAlias = Callable[[OptimizerWrapper[Any]], None]
"""``hook(wrapper)``: right before the inner optimizer's step of a real step."""
StepHook: TypeAlias = Callable[[OptimizerWrapper[Any], StepOutcome], None]
"""``hook(wrapper, outcome)``: after a ``step()`` call, with what it did."""


class HookHandle(Protocol):
    """What ``register_hooks`` returns (``torch.utils.hooks.RemovableHandle`` is one)."""

    def remove(self) -> None:
        """Stop calling the hooks registered with it."""
        ...


class TrainingContext(Protocol):
    """Precision, device, accumulation and loop position for the wrappers of one model.

    Surface
        [SURFACE-002] A context has every member declared here, each accepting every call that this protocol
        allows, and its ``wrap`` returns an :class:`OptimizerWrapper` of the optimizer's own type.

    Construction
        [CTX-001] ``accumulate_grad_batches`` is a positive ``int``; anything else (``0``, ``-1``, ``2.0``,
        ``True``) raises ``ValueError`` or ``TypeError`` at construction.

        [ERR-003] An unknown precision or device name raises ``ValueError`` naming the valid ones.

        [ERR-006] Device ``"xla"`` where torch_xla cannot be imported raises an error that names torch_xla.

    Precision
        [PREC-001] 64-true and 32-true: no autocast. ``prepare_module`` converts dtypes as Lightning's precision
        plugins do: 64-true casts the module's floating-point parameters and buffers to float64, as
        ``module.double()`` does (complex and integer tensors keep their dtype); 32-true and the mixed precisions
        convert nothing, so a module keeps the dtypes it was built with (a float64 buffer or parameter stays
        float64, a complex one complex).

        [PREC-002] bf16-true and 16-true: the module's floating-point parameters and buffers, and so the optimizer
        state, live in bfloat16 and float16, as ``module.to(dtype)`` leaves them (Lightning's bf16-true and
        16-true); integer buffers keep their dtype. No autocast and no loss scaler: a 16-true step is never
        skipped. ``prepare_module`` refuses a module that holds a complex parameter or buffer with ``ValueError``
        naming it, before anything changes: ``module.to(dtype)`` would discard its imaginary part.

        [PREC-003] bf16-mixed: forward passes run under bfloat16 autocast; no loss scaler, never a skipped
        step.

        [PREC-004] The context's autocast region (``autocast()``, and the region a closure runs in) casts the
        parameters anew for every forward: a forward that runs after a real step inside the same region (a GAN
        iteration that steps the generator before the discriminator's forward, a loop that opens one region around
        a whole iteration or epoch) sees the parameters that step produced, in every precision and on every device,
        as ``torch.autocast(..., cache_enabled=False)`` does and Lightning opens it.

        Rationale: autocast's weight cache keeps one cast of each parameter per region; a region that outlives a
        step would run the next forward on the weights before that step.

        [AMP-001] 16-mixed: forward passes run under float16 autocast and ``torch.amp.GradScaler`` scales the
        loss, on every device including CPU; every scaler call receives the inner optimizer.

        [AMP-002] 16-mixed: gradients are unscaled exactly once per real step, after window normalisation and
        before clipping and the inner step; an ``unscale_gradients()`` before ``step()`` is not repeated.

        [AMP-003] 16-mixed: the scaler is updated once per training iteration, after every optimizer that
        stepped in it, so one optimizer's overflow cannot change another's gradient scale within the
        iteration. Inside ``batch()`` the iteration is the block; outside any ``batch()`` every real step ends
        one, and the update follows that step. A window that ``unscale_gradients()`` prepared and that has not
        stepped yet postpones the update (its gradients were unscaled with the current scale, and its step must
        see that scale's found-inf): outside ``batch()`` until right after its real step, inside until the end of
        the block in which it steps.

        Rationale: outside ``batch()`` the real step is the only boundary there is; postponing the update to
        a later one would keep an overflowing optimizer skipping at a scale already known to be too large.

        [AMP-004] 16-mixed: a step whose gradients are not finite (as the scaler's found-inf says, fused
        optimizers included) leaves parameters and optimizer state untouched, is reported as
        ``SKIPPED_NON_FINITE``, and does not count as a step.

        [AMP-005] 16-mixed: ``wrap`` of an optimizer that evaluates closures itself (LBFGS) raises ``TypeError``.

        [AMP-006] 16-mixed: when the scale changes while another window holds gradients (micro-steps it
        accumulated, or a backward whose step has not come yet), those gradients are rescaled to the new scale,
        so its real step still applies their true mean (no optimizer unscales gradients by a scale they were
        not made with).

        [AMP-007] 16-mixed: each backward through the context propagates the standard recipe's scaled loss,
        ``scaler.scale(loss / N)`` with ``N = accumulate_grad_batches`` (Lightning's automatic loop, torch's AMP
        examples), so a micro-step is no closer to float16's range than the recipe's: the windows that the recipe
        applies are applied, those it skips are skipped, and the scale grows and backs off as the recipe's does.
        The real step still applies the window's mean (ACC-001): a window of ``k`` micro-steps (full, cut short by
        ``make_optimizer_step=True``, flushed by the epoch's last batch, or made longer by
        ``make_optimizer_step=False``) applies its unscaled sum times ``N / k``. ``N`` is the context's setting, as
        the recipe's divisor is, because a window's length is not known before it closes; a state taken with a
        window open therefore loads only into a context with the same ``accumulate_grad_batches`` (CKPT-003).

        Rationale: a wrapper that divides only at the step keeps each micro-step ``N`` times closer to overflow
        than the recipe, and skips windows that the recipe applies.

        [AMP-008] 16-mixed: a ``step()`` whose closure ran a backward that wrote gradients of the wrapper's
        parameters without a wrapper's ``backward`` (``loss.backward()``, ``torch.autograd.backward``: the loss not
        scaled) raises ``RuntimeError`` naming ``opt.backward(loss)`` once the closure returns, before the step
        applies anything; the call fails as a raising closure does (CLOS-003). It is told from the gradients
        (what autograd accumulated into them), not from what the closure returns or calls: a closure that ran a
        wrapper's backward and also an unscaled one is refused; ``torch.autograd.grad``, which writes no gradient,
        is not.

        Rationale: unscaling would divide such gradients by the loss scale, and the step would apply them 65536
        times too small with nothing said.

    Clipping
        [CTX-002] ``gradient_clip_val`` is ``None`` or a finite positive number; ``nan``, ``inf``, ``0`` or a
        negative value raise ``ValueError`` at construction. ``gradient_clip_algorithm`` is ``"norm"`` (the
        default) or ``"value"``, and ``"value"`` without a ``gradient_clip_val`` raises ``ValueError`` at
        construction too: it would clip nothing.

        [CLIP-001] A context built with ``gradient_clip_val`` clips each window's unscaled, normalised gradients
        right before the inner step: their total 2-norm over all of the optimizer's parameters, every group
        included (``gradient_clip_algorithm="norm"``), or each element (``"value"``), as
        ``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_`` compute it; the gradients of the other
        optimizers are not touched. An optimizer that evaluates the closure itself (LBFGS) gets the gradients of
        every evaluation clipped before it uses them. A 16-mixed window whose gradients are not finite is clipped
        too, as torch's recipe (``unscale_``, clip, ``scaler.step``) clips it, before the step is skipped: by norm,
        its gradients become what ``clip_grad_norm_`` makes of a non-finite norm (NaN where they were not finite,
        zero elsewhere), and that is what ``before_optimizer_step`` sees (HOOK-002).

    Devices and distribution
        [XLA-001] XLA: on a real step the window's gradients are reduced across replicas once, after the
        window's last backward, then the inner optimizer steps, then the graph is cut once; a micro-step that only
        accumulates neither reduces nor cuts the graph, so a window costs one reduction and one cut. A real step
        skipped for non-finite gradients (16-mixed) cuts the graph once too: its window ends there. With several
        optimizers, each window is reduced once, at its own real step, whichever optimizer steps first; another
        optimizer's window that only accumulates in that iteration is neither reduced nor cut by it.

        [XLA-002] XLA on several devices under SPMD (the cell's strategy ``"spmd"``: one process drives them, the
        batch sharded over them, no process group): the
        cross-device reduction of the gradients is XLA's, inside the compiled graph, and the implementation adds
        none of its own; a micro-step that only accumulates does not cut the graph and each real step cuts it
        once, so a window executes as one graph; the parameters equal the single-device result on the global
        batch.

        [DDP-001] DDP: micro-steps that do not close a window run their closure under ``no_sync()``, so a
        window costs one gradient all-reduce. In a micro-step that closes a window, every DDP module holding none
        of that window's parameters runs under ``no_sync()`` too: toggled out of the backward, its forward under
        sync would leave DDP waiting for its gradients, and its next backward would all-reduce inside
        ``no_sync()``. Counted on the process group, only micro-steps that close a window reduce.

        [DDP-002] DDP: after a real step the parameters are identical on every rank and equal to the
        single-process result on the global batch.

    Sharded training (FSDP2)
        [FSDP-001] A context for sharded training (the cell's strategy ``"fsdp"``) returns from
        ``prepare_module`` the module sharded with ``torch.distributed.fsdp.fully_shard`` (an ``FSDPModule``
        whose parameters are ``DTensor`` shards); a module the user sharded already (an ``FSDPModule``, or one
        whose blocks are) is kept as it is, and each of its FSDP units is controlled as FSDP-002 says.
        Every other rule of this contract holds with sharded parameters and gradients.

        [FSDP-002] FSDP: micro-steps that do not close a window run their backward without gradient sync
        (``set_requires_gradient_sync(False)`` on every prepared FSDP module), and the micro-step that closes
        it syncs, so a window costs one reduce-scatter round.

        [FSDP-003] FSDP: after a real step the parameters, gathered, are identical on every rank and equal to
        the single-process result on the global batch; the window mean, unscaling and clipping apply to the
        sharded gradients, and clipping by norm uses the global 2-norm over every rank's shards.

        [FSDP-004] FSDP, 16-mixed: a non-finite gradient on any rank skips the step on every rank, and every
        rank reports ``SKIPPED_NON_FINITE``.

        [FSDP-005] FSDP: a real step whose window holds gradients that no backward synced (its last backward
        ran inside ``toggle_model(sync_grad=False)``) raises ``RuntimeError`` before anything changes: those
        gradients never reached the shards, and the step would apply none of them.

        [FSDP-006] FSDP checkpoints: the model's and optimizers' sharded states go through
        ``torch.distributed.checkpoint`` (``get_model_state_dict`` and ``get_optimizer_state_dict``), the context's
        ``state_dict()`` is each rank's own. At the same world size a state taken with windows open resumes bit
        for bit (CKPT-002); a state taken with no window open resumes at another world size, and one with a
        window open raises ``ValueError`` there, before anything changes (each rank's part of an open window is
        its own shard of the global batch).

    Checkpoints
        [CKPT-002] ``state_dict()`` holds the context's own state (window positions, accumulated gradients
        of open windows, step counts, loss-scaler state); loading it into a fresh context with the same
        model and optimizers, at any micro-step, continues the identical trajectory (the wrappers' ``last_outcome``
        is not part of it, STEP-004): bit for bit on CPU and
        CUDA, and to rounding on XLA, which compiles the resumed run into other graphs. The state is loaded
        after the same optimizers are wrapped, in the same order (as frameworks restore optimizer states after
        building them); before that, it is a state for another layout (CKPT-003).

        [CKPT-003] ``load_state_dict`` rejects a state for another layout (other optimizers, other parameter
        shapes), or a malformed one (any entry of the wrong kind, the loss scaler's included), with ``ValueError``
        before changing anything; so is, under 16-mixed, a state taken with a window open at another
        ``accumulate_grad_batches`` (its gradients carry that divisor, AMP-007), a state of another failure
        policy (FAIL-006), and one of another ``zero_grad_after_step`` (ZERO-007).

        [CKPT-004] A state taken inside ``batch()`` after a real step, before the block ends, holds the
        iteration's pending loss-scaler update (that an optimizer stepped, and whether its gradients were
        finite); a context loaded from it inside the resumed ``batch()`` applies that update when the block ends,
        together with those of the real steps it takes before, so the trajectory continues bit for bit. The same
        holds for a ``pickle`` or ``copy.deepcopy`` taken there (PICKLE-001). A state or copy taken while a
        ``step()`` runs, or after ``unscale_gradients()`` before its closing step, is refused with
        ``RuntimeError``.

    Failures (what a ``step()`` that raises leaves behind)
        [FAIL-001] ``on_failure`` is ``"discard"`` (the default) or ``"restore"``, given at construction and read
        back from the ``on_failure`` property; any other value raises ``ValueError`` at construction. An
        implementation that does not claim the feature ``"exact_restore"`` may refuse ``"restore"`` the same way.

        [FAIL-002] Under both policies, a call that is refused (bad arguments, a re-entered ``step()``, a stage
        that forbids it) changes nothing, and so does a call that fails before any of its backwards wrote a
        gradient of the wrapper's window and before its real step's preparation or inner step began (its closure
        raised first, whatever else it did; a hook before the first backward raised): the window's gradients and
        length, its preparation by an earlier ``unscale_gradients()``, ``last_outcome``, the step count,
        the loss scaler and every ``requires_grad`` flag are as before the call. Whether a backward wrote is told
        from the gradients, not from the calls the closure made: a ``loss.backward()`` counts as a wrapper's
        ``backward`` does. A failed call never touches the windows of the context's other wrappers.

        [FAIL-003] Under ``"discard"``, a call that fails after one of its backwards wrote into the window, or in
        the real step's preparation or inner step, discards that wrapper's window: every gradient the window holds
        is ``None`` (under FSDP its unsynced sums too), its length is 0, the loss scaler forgets what it recorded of
        the optimizer in this iteration (the next window is unscaled once, as a fresh one), the step count is
        unchanged and ``last_outcome`` is ``StepOutcome.DISCARDED``. A window that ``unscale_gradients()`` prepared
        is discarded the same way when its closing step fails in its inner step (its closure cannot run a
        backward). The exception propagates with a note (``BaseException.add_note``) that names the optimizer, how
        many micro-steps were discarded and ``on_failure="restore"`` as the way to keep them. The next call starts
        a new window, which is exact.

        Rationale: keeping a failed window costs a copy of it while every call runs; the failure a call most
        often meets halfway through a backward is running out of memory, which that copy makes likelier, and
        frameworks that recover from a failed micro-step skip that batch.

        [FAIL-004] Under ``"restore"``, a failed call leaves the window exactly as it was before the call
        (CLOS-003, TXN-001): its gradients (under FSDP the unsynced sums too), length, preparation,
        ``last_outcome``, the step count and the loss scaler's record. The price is one extra set of the calling
        wrapper's window gradients while an accumulating or closing call runs.

        [FAIL-005] An optimizer that evaluates its closure itself (CLOS-002) is restored exactly under both
        policies: a failed step leaves its parameters, gradients and state as they were before the call.

        [FAIL-006] ``state_dict()`` and copies (``pickle``, ``copy.deepcopy``) carry the policy; ``load_state_dict``
        refuses a state of the other policy with ``ValueError`` before changing anything (CKPT-003).

        [FAIL-007] A failed ``unscale_gradients()`` called between ``step()`` calls is a failed call of its window:
        its preparation writes into the window from its first step (the mean of a window cut short, the unscaling,
        clipping), so under ``"discard"`` the window is discarded as FAIL-003 says (its gradients ``None``, its
        length 0, the loss scaler's record of the optimizer in this iteration dropped, ``last_outcome``
        ``StepOutcome.DISCARDED``, the note on the exception), and under ``"restore"`` it is exactly as before the
        call (FAIL-004): its gradients, length and carried part, not prepared, the loss scaler's record as it was.
        Either way calling it again, or the closing ``step()``, applies what the recipe applies: the window's mean
        once, unscaled once. A refused call changes nothing (FAIL-002); one made in the closure of the closing
        ``step()`` fails that call.

        Rationale: the preparation changes the gradients in place; left halfway, they are neither the window nor
        its preparation, and a retry would divide them by the window's length a second time.

        [FAIL-008] Every other call of a wrapper that writes into windows follows the policy too. A wrapper's
        ``backward()`` called outside ``step()`` (the direct form) that fails after autograd wrote a gradient of
        any window of the context (a tensor hook or an ``after_backward`` hook raising, memory running out halfway)
        is a failed call of every window it wrote into: under ``"discard"`` each of those is discarded as FAIL-003
        says (the note on the exception names them), the others are untouched; under ``"restore"`` every window of
        the context is exactly as before the call (gradients, length, carried part). One that fails before autograd
        wrote anything changes nothing (FAIL-002). A wrapper's ``add_param_group`` or ``load_state_dict`` that
        raises leaves the inner optimizer's ``param_groups`` and ``state`` as they were before the call (the
        same objects, the same entries), and the window unchanged. Either way a retry is exact.

        [FAIL-009] ``discard(wrapper)`` drops the wrapper's window, whatever the policy, as FAIL-003 discards one:
        every gradient of its parameters (and of parameters that left the optimizer while the window was open)
        ``None``, its length 0, the carried part dropped (ZERO-007), ``last_outcome`` ``StepOutcome.DISCARDED``, the
        step count unchanged; a window that ``unscale_gradients()`` prepared is dropped the same way, and the loss
        scaler forgets that unscaling (the next window is unscaled once); a real step the optimizer took earlier in
        the iteration stays in the scaler's record, for the iteration's update. It is how a loop recovers from
        WIN-001 and WIN-002, and from a failure it decides to skip. It raises ``RuntimeError`` while a ``step()`` of
        the context runs, and ``ValueError`` for anything but a wrapper of this context, before anything changes.

    Windows changed from outside (what a call finds that the wrappers did not do)
        [WIN-001] An optimizer's parameters change only between its windows. Parameters added to or removed from
        its ``param_groups`` other than by the wrapper's ``add_param_group`` (appended to or popped from a group's
        ``params``, a group appended or removed) are found by the wrapper's next ``step()`` or
        ``unscale_gradients()``, before anything changes. With no micro-step accumulated (the window's length 0),
        an added parameter is checked as ERR-007 checks ``wrap``'s (``ValueError``, the call changes nothing) and
        otherwise joins: that call's window holds it, and the step applies its gradient as torch's would. With a
        window open the call raises ``RuntimeError`` naming the optimizer and how many parameters were added and
        removed, and saying to change the parameters after the window's real step or to drop the window with
        ``discard(wrapper)``; the call changes nothing, and every later call of that wrapper does the same until the
        parameters are as the window knew them or the window is discarded. ``add_param_group`` on the wrapper with
        a window open raises the same ``RuntimeError`` before the inner optimizer changes.

        Rationale: a parameter that joins mid-window has accumulated over fewer micro-steps than the window's
        length divides by, and one that leaves keeps its accumulated gradient; neither has a mean that torch's
        recipe defines.

        [WIN-002] A gradient of an open window cleared from outside (``model.zero_grad()``, the inner optimizer's
        own ``zero_grad()``, ``p.grad = None``) is found by the next call of a wrapper of the context that would
        use or add to that window: the window's own ``step()`` and ``unscale_gradients()``, and any wrapper's
        ``backward()`` called outside ``step()``. A parameter of the window that had a gradient when the last call
        of the context's wrappers returned, and has none now, makes that call raise ``RuntimeError`` before anything
        changes, saying that the window's gradients were cleared outside its wrapper, and to clear them with the
        wrapper's ``zero_grad()`` (ZERO-002) or to drop the window with ``discard(wrapper)``. An open window is one
        whose length is at least 1. Gradients zeroed in place (``zero_grad(set_to_none=False)``) cannot be told
        from the window's own accumulation, nor can a gradient that another backward wrote again after clearing;
        those are the user's.

    Hooks (what a framework calls its own hooks from: Lightning's ``on_before_backward``, ``on_after_backward``,
    ``on_before_optimizer_step``, its global step and LR schedulers; the feature ``"hooks"``: an implementation
    that does not claim it may refuse ``register_hooks`` with ``NotImplementedError``)
        [HOOK-001] ``before_backward(wrapper, loss)`` runs in each ``backward(loss)`` of a wrapper of the context,
        after the call's checks and before autograd, with the loss as passed (unscaled); ``after_backward(wrapper,
        loss)`` right after autograd returns, the gradients as the backward left them (scaled under 16-mixed, AMP-007).
        A refused ``backward()`` runs neither. Both run outside autocast, as autograd does (BWD-002).

        [HOOK-002] ``before_optimizer_step(wrapper)`` runs once per real step, after the window's preparation
        (mean, reduction, unscaling, clipping) and before the inner optimizer's step: the gradients it sees are
        those the step applies, non-finite ones included when 16-mixed then skips the step (clipped as CLIP-001
        says). An accumulating call runs none. For an optimizer that evaluates the closure itself (CLOS-002) it runs
        once per real step, before the inner step, which then makes its evaluations (each of whose backwards runs
        HOOK-001's hooks); ``after_step`` too runs once per call, not once per evaluation.

        [HOOK-003] ``after_step(wrapper, outcome)`` runs after each ``step()`` call that returns, with the call's
        outcome (what ``last_outcome`` then says), once the window, the counts and the loss scaler are as the call
        leaves them; a call that raises runs none.

        [HOOK-004] A hook that raises propagates its exception. Raised from ``before_backward`` or
        ``before_optimizer_step`` inside a ``step()``, it fails that call as a raising closure does (CLOS-003,
        TXN-001: the window as the failure policy leaves it, everything else as before the call); raised from
        ``after_step``, the call's effects stay. Hooks run in the order they were registered: with several
        ``register_hooks`` calls, the hooks of each kind run in the order of those calls, whatever kinds each call
        registered; ``remove()`` on the returned handle stops them; a hook that is not callable is refused with
        ``TypeError`` when it is registered.

        [HOOK-005] Copies of a context (``pickle``, ``copy.deepcopy``, of it alone or of a whole training state)
        carry no hooks: hooks belong to the framework that registered them (they close over its objects, and a
        lambda cannot be pickled), which registers them again on a copy it trains, as torch's optimizers drop their
        step hooks when copied. Copying a context whose hooks cannot be pickled works; the original keeps its
        hooks.

    Wrapping
        [ERR-004] Wrapping an object that is already a wrapper raises ``TypeError``.

        [ERR-010] ``wrap`` of an optimizer that another live training context already wraps raises ``ValueError``
        (two contexts would keep two windows and two loss scalers over the same gradients), and so does a second
        ``wrap`` of it by the same context (two windows over the same gradients). A context is live until it is
        collected: one kept only by its own reference cycles still wraps the optimizer until ``gc.collect()``
        frees it, and nothing but the user's references may keep a context alive, so that once they are gone and it
        is collected the optimizer can be wrapped again.

        [ERR-007] ``wrap`` refuses, with ``ValueError``, an optimizer that holds a floating-point parameter off the
        context's device or in a dtype the precision does not train: other than float64 in 64-true, bfloat16 in
        bf16-true and float16 in 16-true (what ``prepare_module`` gives), and float16 under 16-mixed (the loss
        scaler cannot unscale float16 gradients); 32-true, bf16-mixed and 16-mixed otherwise take any
        floating-point dtype, as ``prepare_module`` leaves it (PREC-001). Frozen parameters
        (``requires_grad=False``) are checked too, since they may be unfrozen later; ``add_param_group`` on a
        wrapper refuses such a parameter the same way, before the inner optimizer changes.

    Zeroing (what a real step leaves of its gradients)
        [ZERO-003] ``zero_grad_after_step`` is ``True`` (the default) or ``False``, given at construction and read
        back from the ``zero_grad_after_step`` property; any other value (``1``, ``None``, ``"no"``) raises
        ``TypeError`` at construction. ``True``: every real step clears the gradients it applied (ZERO-001). An
        implementation that does not claim the feature ``"user_zero_grad"`` may refuse ``False`` with
        ``ValueError``.

        [ZERO-004] ``zero_grad_after_step=False``: a real step that is taken leaves the gradients of the wrapper's
        parameters as it applied them, and the context does not change them (the loss scaler's update does not rescale
        them, AMP-006), until the user's ``zero_grad()`` clears them (when no window is open, ZERO-002), as Lightning's
        ``optimizer_zero_grad`` hook clears them. A real step skipped for non-finite gradients (16-mixed) sets them to
        ``None`` all the same (ZERO-001). An optimizer that evaluates its closure itself leaves its last evaluation's
        gradients, as torch's LBFGS does; they are never carried (CLOS-004 sets them to ``None`` before its next
        evaluation).

        Rationale: Lightning's automatic loop clears gradients in the module's ``optimizer_zero_grad`` hook, which
        a module may override to keep them across steps; carried infinities would skip every later step.

        [ZERO-005] ``zero_grad_after_step=False``: a window carries the gradients that the last taken real step of its
        wrapper left, as they are when the window takes them: at the wrapper's first ``step()`` or
        ``unscale_gradients()`` call since that step, or at the first ``backward()`` of any wrapper of the context while
        one of the window's parameters requires grad (not toggled off, TOGGLE-001), whichever comes first; it takes all
        of them at once. Until the window's first micro-step has accumulated, the wrapper's ``zero_grad()`` clears them,
        taken or not, as torch's ``zero_grad(set_to_none)`` clears gradients (``set_to_none=False`` leaves zeros where
        there were gradients, which carry nothing), except after ``unscale_gradients()``, where it raises (CLIP-002).
        The real step that closes the window applies the carried gradients plus the mean of the window's own micro-
        steps, ``c + (g_1 + ... + g_k) / k`` (ACC-001 over the window's micro-steps alone, whatever its length). The
        carried part is what the last step applied: it is not divided by the window's length, not unscaled again under
        16-mixed, and not rescaled when the loss scale changes (AMP-006); under DDP, FSDP and XLA it is not reduced
        again, since every rank holds the same (plain DDP, which reduces it with the window's gradients, gives the same
        to rounding). It is clipped with the rest, since CLIP-001 clips what the step applies, and
        ``unscale_gradients()`` makes the gradients that sum (CLIP-002). The price: one extra set of the wrapper's
        gradients while its window carries some (a copy where they are views into a DDP bucket, which the next reduction
        would overwrite); nothing under ``True``. Gradients that a context finds on the parameters and that no step of
        its own left (a context loaded from a state, a copy) are not carried: they are the window's own, as those of a
        backward outside ``step()``.

        Rationale: plain Lightning's 16-mixed and torch's recipe unscale the carried gradients a second time with
        the window's, which divides them by the loss scale; the carried part is kept apart so that it is not.

        [ZERO-006] ``zero_grad_after_step=False``: gradients that the last real step left and that changed in place
        before the window took them (a backward outside ``step()`` and the wrappers' ``backward()``, such as
        ``loss.backward()`` before ``step()``; an in-place ``zero_grad(set_to_none=False)`` of the module or of the
        inner optimizer) cannot be told from the carried part: the ``step()``, ``unscale_gradients()`` or ``backward()``
        that would take them raises ``RuntimeError`` naming ``opt.zero_grad()``, and changes nothing. Gradients that
        were replaced or set to ``None`` outside the wrapper (``model.zero_grad()``; also a ``create_graph=True``
        backward, for which autograd replaces the gradient) carry nothing: what is on the parameters then is the
        window's own.

        [ZERO-007] ``zero_grad_after_step=False``: a window's carried part fails with it: a failed call under
        ``on_failure="discard"`` clears it with the window (FAIL-003; the exception's note says that the carried
        gradients went too), under ``"restore"`` it is as before the call, taken or not (FAIL-004). A take by a backward
        in another wrapper's call stays when that call fails: it moves no gradient's value, so it does not touch that
        window (FAIL-002). Once taken the carried part is part of the window: a state or copy holds it (CKPT-002,
        PICKLE-001). Gradients that a real step left and no window has taken are the user's, as an optimizer's
        ``state_dict()`` holds no gradients: they are not context state, and a run resumed from a state taken then
        continues the same trajectory when its next window starts from cleared gradients (``zero_grad()`` at the
        window's start, as Lightning's loop calls it); gradients it finds otherwise are its window's own (ZERO-005).
        States and copies carry the setting; ``load_state_dict`` refuses a state of the other setting with
        ``ValueError`` before changing anything (CKPT-003).
    """

    @property
    def precision(self) -> Precision:
        """The precision this context applies."""
        ...

    @property
    def device(self) -> torch.device:
        """The device the model and the optimizer state live on."""
        ...

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``. [STEP-003]"""
        ...

    @property
    def on_failure(self) -> FailurePolicy:
        """What a failed ``step()`` leaves of its window: ``"discard"`` or ``"restore"``. [FAIL-001]"""
        ...

    @property
    def zero_grad_after_step(self) -> bool:
        """Whether a real step clears the gradients it applied, or leaves them to ``zero_grad()``. [ZERO-003]"""
        ...

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move and cast ``module`` for this context (wrap it for DDP, or shard it); build optimizers on the result."""
        ...

    def wrap(self, optimizer: OptimizerT) -> OptimizerWrapper[OptimizerT]:
        """Wrap an optimizer built on the prepared module's parameters; the wrappers of one context share it."""
        ...

    def autocast(self) -> AbstractContextManager[None]:
        """The autocast region for forward passes in this context's precision (a no-op for true precisions)."""
        ...

    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        """Mark one iteration of the loop: batch ``batch_idx`` of the epoch, and whether it is the last one.

        The schedule of ``make_optimizer_step=None`` reads the position [STEP-003]; leaving the block ends the
        training iteration (where 16-mixed updates its scaler [AMP-003]).

        [CTX-003] Blocks do not nest: ``batch()`` inside a block raises ``RuntimeError`` when it is entered and
        changes nothing (the outer block goes on). Leaving a block by an exception ends the iteration as leaving it
        normally does: 16-mixed updates its scaler for the real steps the block took, the position is released, the
        exception propagates unchanged, and windows left open stay open (a ``step()`` that failed left its window as
        the failure policy says); the next block works as after any other.
        """
        ...

    def state_dict(self) -> dict[str, Any]:
        """The context's own state, separate from the optimizers' state dicts. [CKPT-002]"""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state saved by ``state_dict``. [CKPT-002] [CKPT-003]"""
        ...

    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        """Drop ``wrapper``'s window, whatever the failure policy: gradients ``None``, length 0. [FAIL-009]"""
        ...

    def register_hooks(
        self,
        *,
        before_backward: BackwardHook | None = None,
        after_backward: BackwardHook | None = None,
        before_optimizer_step: OptimizerStepHook | None = None,
        after_step: StepHook | None = None,
    ) -> HookHandle:
        """Call these around every wrapper's ``backward`` and ``step``. [HOOK-001] [HOOK-002] [HOOK-003] [HOOK-004]"""
        ...
