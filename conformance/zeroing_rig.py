"""What the zeroing checks (ZERO-003 to ZERO-007) share: a plain loop that leaves zeroing to the user, and a rig.

:class:`PlainUserZeroGrad` is the contract's windows worked out by hand on bare optimizers, plain
``torch.autocast`` and, under 16-mixed, one plain ``torch.amp.GradScaler`` driven as torch's recipe drives it. With
``clear=False`` (``zero_grad_after_step=False``) a taken real step leaves the gradients it applied; the window's
first micro-step (its ``step()``, ``unscale_gradients()`` or a backward that reaches them) moves them aside; the
window accumulates its own micro-steps from none; its real step takes their mean, ``unscale_``, then adds the
carried part back, then clips and steps, so the carried part is divided, unscaled and rescaled by nothing. A
skipped step clears under both settings. Nothing of it comes from an implementation.

:class:`ZeroRig` drives an implementation (two halves of a model, one wrapper each) and that plain loop side by
side, one user action at a time, and checks after every real step that the gradients the step leaves are the
plain loop's: ``None`` under ``zero_grad_after_step=True`` [ZERO-001], what it applied under ``False`` [ZERO-004].
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, Literal

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import assert_grads_close, last_outcome, outcome_names
from lightning_optimizer.conformance.checkpointing import through_a_checkpoint
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    FlakyAdam,
    FlakySGD,
    Halves,
    adam_eps,
    assert_params_close,
    context_loss,
    failure_settings,
    make_batches,
    scaler_settings,
    zeroing_settings,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    Carried,
    ClipFunction,
    add_carried,
    clipper,
    oracle_loss,
    params_of,
    plain_scaler,
    real_step,
    scaled_backward,
    take_gradients,
    update_scaler,
    window_mean,
)
from lightning_optimizer.spec import (
    Cell,
    FailurePolicy,
    GradScalerSettings,
    OptimizerWrapper,
    StepOutcome,
    TrainingContext,
)

__all__ = [
    "FORM_NAMES",
    "LR",
    "Form",
    "Kind",
    "PlainUserZeroGrad",
    "ZeroRig",
    "make_optimizer",
]

A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE

Form = Literal["closure", "loss.backward", "backward", "toggle_model"]
"""How a call backpropagates: ``step(closure)`` whose closure calls ``wrapper.backward`` or ``loss.backward()``;
``wrapper.backward`` then ``step()``; ``wrapper.backward`` inside ``toggle_model()``, then ``step()``."""
FORM_NAMES: dict[Form, str] = {
    "closure": "closure, wrapper.backward",
    "loss.backward": "closure, loss.backward",
    "backward": "backward, then step()",
    "toggle_model": "toggle_model block, then step()",
}
"""Each form as ``dimensions.DIMENSIONS["call_form"]`` names it."""

Kind = Literal["sgd", "sgd_momentum", "adam", "flaky_sgd", "flaky_adam", "lbfgs"]
"""The rig's optimizers; ``flaky_*`` raise in their step while ``fail`` is set (:class:`.harness.FlakySGD`)."""

LR = 10.0
"""SGD's learning rate: a gradient off by any factor moves the parameters far beyond the tolerance."""
HALF_LR = 1.0
"""SGD's learning rate in 16-true: still far beyond 16-true's tolerance, and the parameters stay in float16's range."""
ADAM_LR = 0.01


def make_optimizer(kind: Kind, module: torch.nn.Module, cell: Cell, groups: int = 2) -> torch.optim.Optimizer:
    """An optimizer of ``kind`` over ``module``; ``groups=2``: its last layer in a group of its own, at half the lr.

    In 16-true (float16 parameters and optimizer state) SGD's learning rate is ``HALF_LR``, and Adam's ``eps`` one
    float16 holds (:func:`.harness.adam_eps`): the checks' inputs would overflow float16 otherwise.
    """
    params = list(module.parameters())
    adam = kind in ("adam", "flaky_adam")
    lr = ADAM_LR if adam else (HALF_LR if cell.precision == "16-true" else LR)
    eps = adam_eps(cell)
    param_groups: list[dict[str, Any]] = (
        [{"params": params}] if groups == 1 else [{"params": params[:-2]}, {"params": params[-2:], "lr": lr / 2}]
    )
    if kind == "sgd":
        return torch.optim.SGD(param_groups, lr=lr)
    if kind == "sgd_momentum":
        return torch.optim.SGD(param_groups, lr=lr, momentum=0.9)
    if kind == "flaky_sgd":
        return FlakySGD(param_groups, lr=lr, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(param_groups, lr=lr, eps=eps)
    if kind == "flaky_adam":
        return FlakyAdam(param_groups, lr=lr, eps=eps)
    return torch.optim.LBFGS(params, lr=0.5, max_iter=3, history_size=3)


class PlainUserZeroGrad:
    """Bare optimizers and one plain ``GradScaler``: each optimizer's window as the rules make it, worked by hand.

    ``clear``: ``zero_grad_after_step``. Call :meth:`backward` for each backward pass, :meth:`micro_step` for each
    ``step()`` call once its backward ran (it closes the window when ``closes``), :meth:`prepare` for
    ``unscale_gradients()``, :meth:`zero_grad` for the user's ``zero_grad()`` and :meth:`end_iteration` when a
    training iteration ends.
    """

    def __init__(
        self,
        cell: Cell,
        optimizers: dict[str, torch.optim.Optimizer],
        scaler: GradScaler | None,
        accumulate: int,
        *,
        clip: ClipFunction | None,
        clear: bool,
    ) -> None:
        self.cell, self.optimizers, self.scaler, self.accumulate = cell, optimizers, scaler, accumulate
        self.clip, self.clear = clip, clear
        self.pending = dict.fromkeys(optimizers, 0)
        """Micro-steps each window accumulated (its ``step()`` calls that did not close it)."""
        self.left = dict.fromkeys(optimizers, False)
        """Whether the optimizer's gradients are what its last taken real step left (not taken yet)."""
        self.carried: dict[str, Carried | None] = dict.fromkeys(optimizers)
        """What each window took from the last taken real step, set aside."""
        self.prepared: set[str] = set()
        self.stepped = False
        self.carrying: dict[str, bool] = dict.fromkeys(optimizers, False)
        """Whether each optimizer's last real step applied a carried part (what a check exercised)."""

    def params(self, name: str) -> list[torch.Tensor]:
        """The parameters of optimizer ``name``, group by group."""
        return params_of(self.optimizers[name])

    def closes(self, name: str, make_optimizer_step: bool | None, position: tuple[int, bool] | None) -> bool:
        """Whether a ``step()`` with ``make_optimizer_step`` closes ``name``'s window here [STEP-001 to STEP-003]."""
        if make_optimizer_step is not None:
            return make_optimizer_step
        if position is None:
            return self.pending[name] + 1 >= self.accumulate
        batch_idx, is_last = position
        return (batch_idx + 1) % self.accumulate == 0 or is_last

    def take(self, name: str) -> None:
        """The window's first micro-step takes what the last taken real step left [ZERO-005]."""
        if self.left[name]:
            self.carried[name] = take_gradients(self.params(name)) or None
            self.left[name] = False

    def backward(self, name: str, loss: torch.Tensor, *, reaches: Sequence[str] = ()) -> None:
        """A backward pass of ``loss`` into ``name``'s window (after the windows in ``reaches`` took theirs)."""
        for other in (name, *reaches):
            self.take(other)
        scaled_backward(loss, self.scaler, self.accumulate)

    def prepare(self, name: str) -> None:
        """``unscale_gradients()`` before the closing step: the full window's mean, unscaled, plus the carried part."""
        self.take(name)
        params = self.params(name)
        window_mean(params, self.pending[name] + 1, self.scaler, self.accumulate)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizers[name])
        add_carried(self.carried[name])
        self.carrying[name] = bool(self.carried[name])
        self.carried[name] = None
        self.prepared.add(name)

    def micro_step(self, name: str, closes: bool, *, inside_batch: bool = True) -> StepOutcome:
        """A ``step()`` call whose backward ran: accumulate, or the real step; its outcome."""
        self.take(name)
        if not closes:
            self.pending[name] += 1
            return A
        prepared = name in self.prepared
        if not prepared:
            self.carrying[name] = bool(self.carried[name])
        finite = real_step(
            self.optimizers[name],
            self.pending[name] + 1,
            self.scaler,
            self.accumulate,
            clip=self.clip,
            check_finite=self.scaler is not None,
            prepared=prepared,
            carried=self.carried[name],
            clear=self.clear,
        )
        self.carried[name], self.pending[name] = None, 0
        self.prepared.discard(name)
        self.left[name] = not self.clear and finite
        self.stepped = self.scaler is not None
        if not inside_batch:
            self.end_iteration()  # outside any batch() every real step ends an iteration [AMP-003]
        return S if finite else SKIP

    def zero_grad(self, name: str, set_to_none: bool = True) -> None:
        """The user's ``zero_grad()``: a no-op while the window holds micro-steps; else it clears, the carried too."""
        if self.pending[name]:
            return
        carried = self.carried[name] or {}
        if not set_to_none:  # zeros where the carried part was: what it carried is gone either way
            for param, grad in carried.items():
                if param.grad is None:
                    param.grad = torch.zeros_like(grad)
        self.carried[name], self.left[name] = None, False
        self.optimizers[name].zero_grad(set_to_none=set_to_none)

    def discard(self, name: str) -> None:
        """A failed call under ``"discard"``: the window and its carried part are gone [FAIL-003, ZERO-007]."""
        for param in self.params(name):
            param.grad = None
        self.carried[name], self.left[name], self.pending[name] = None, False, 0

    def end_iteration(self) -> None:
        """The scaler's one update if an optimizer stepped; the windows' own gradients follow the scale [AMP-006].

        Neither what a step left nor what a window carries: both are unscaled already [ZERO-005].
        """
        if self.scaler is not None and self.stepped:
            held = [p for name in self.optimizers if not self.left[name] for p in self.params(name)]
            update_scaler(self.scaler, held)
        self.stepped = False


class ZeroRig:
    """An implementation's context over :class:`.harness.Halves` (``a`` and ``b``, a wrapper each) and the plain loop.

    Every action (:meth:`step`, :meth:`backward`, :meth:`zero_grad`, ...) runs on both. After each real step the
    wrapper's outcome and the gradients the step left are compared with the plain loop's.
    """

    def __init__(
        self,
        make_context: Callable[..., TrainingContext],
        cell: Cell,
        *,
        zero_grad_after_step: bool = True,
        kinds: dict[str, Kind] | None = None,
        groups: int = 2,
        accumulate: int = 1,
        clip: tuple[Literal["norm", "value"], float] | None = None,
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        factor: float = LOSS_FACTOR,
    ) -> None:
        self.cell, self.factor = cell, factor
        self.leave = not zero_grad_after_step
        self.kinds: dict[str, Kind] = kinds or {"a": "sgd_momentum", "b": "adam"}
        self.groups = groups
        self.settings: dict[str, Any] = {"accumulate_grad_batches": accumulate}
        self.settings.update(zeroing_settings(zero_grad_after_step))
        self.settings.update(failure_settings(on_failure))
        if clip is not None:
            self.settings.update(gradient_clip_algorithm=clip[0], gradient_clip_val=clip[1])
        if grad_scaler is not None:
            self.settings.update(scaler_settings(cell, grad_scaler))
        self.make_context = make_context
        self.base = Halves(31, 32)
        self.context, self.model, self.wrappers = self._build()
        self.oracle = oracle_copy(self.base, cell)
        assert isinstance(self.oracle, Halves)
        optimizers = {
            name: make_optimizer(kind, getattr(self.oracle, name), cell, groups) for name, kind in self.kinds.items()
        }
        clip_function = None if clip is None else clipper(*clip)
        scaler = plain_scaler(cell, grad_scaler)
        self.plain = PlainUserZeroGrad(
            cell, optimizers, scaler, accumulate, clip=clip_function, clear=zero_grad_after_step
        )
        self.batches = make_batches(24, seed=5)
        self.position: tuple[int, bool] | None = None

    def _build(self) -> tuple[TrainingContext, Halves, dict[str, OptimizerWrapper[Any]]]:
        context = self.make_context(**self.settings)
        model = context.prepare_module(copy.deepcopy(self.base))
        assert isinstance(model, Halves), f"prepare_module gave a {type(model).__name__}"
        wrappers = {
            name: context.wrap(make_optimizer(kind, getattr(model, name), self.cell, self.groups))
            for name, kind in self.kinds.items()
        }
        return context, model, wrappers

    # -- the loop ---------------------------------------------------------------------------------------------

    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        """One training iteration on both sides (``context.batch``; the plain scaler's update when it ends)."""
        self.position = (batch_idx, is_last)
        try:
            with self.context.batch(batch_idx, is_last=is_last):
                yield
        finally:
            self.position = None
        self.plain.end_iteration()

    def loss(self, name: str, data: int, *, blow_up: bool = False) -> torch.Tensor:
        """The implementation's loss of half ``name`` on batch ``data`` (under the context's autocast)."""
        half = getattr(self.model, name)
        return context_loss(self.context, half, self.batches[data], self.cell, blow_up, self.factor)

    def plain_loss(self, name: str, data: int, *, blow_up: bool = False) -> torch.Tensor:
        """The plain loop's loss of half ``name`` on batch ``data`` (under plain autocast)."""
        half = getattr(self.oracle, name)
        return oracle_loss(half, self.batches[data], self.cell, blow_up, self.factor)

    def step(
        self,
        name: str,
        data: int,
        make_optimizer_step: bool | None = None,
        form: Form = "closure",
        *,
        blow_up: bool = False,
        then: Callable[[], object] | None = None,
        before: Callable[[], object] | None = None,
    ) -> StepOutcome:
        """One micro-step of wrapper ``name`` on batch ``data`` in ``form``, on both sides; the outcome, checked.

        ``then`` runs after the backward (in the closure, or before the closure-less ``step()``); ``before`` first
        thing in the closure, on the implementation's side only (a closure form only).
        """
        assert before is None or form in ("closure", "loss.backward"), "before= needs a closure (a check's defect)"
        wrapper = self.wrappers[name]
        closes = self.plain.closes(name, make_optimizer_step, self.position)
        self.plain.backward(name, self.plain_loss(name, data, blow_up=blow_up))  # first: ``then`` may compare with it

        def backward() -> None:
            if before is not None:
                before()
            loss = self.loss(name, data, blow_up=blow_up)
            loss.backward() if form == "loss.backward" else wrapper.backward(loss)
            if then is not None:
                then()

        if form in ("closure", "loss.backward"):
            wrapper.step(backward, make_optimizer_step=make_optimizer_step)
        else:
            with wrapper.toggle_model() if form == "toggle_model" else nullcontext():
                backward()
            wrapper.step(make_optimizer_step=make_optimizer_step)
        return self.after_call(name, closes, f"{name}.step() on batch {data} ({FORM_NAMES[form]})")

    def after_call(self, name: str, closes: bool, what: str) -> StepOutcome:
        """The plain loop's micro-step of a call the implementation made; the outcome and gradients compared."""
        want = self.plain.micro_step(name, closes, inside_batch=self.position is not None)
        got = last_outcome(self.wrappers[name])
        assert got == want, (
            f"{what}: last_outcome {outcome_names([got])[0]}, the plain loop's {want.value} (the call closes its "
            "window or accumulates as STEP-001 to STEP-003 say, and reports it [STEP-004])"
        )
        if closes:
            self.assert_left(name, what)
        return want

    def assert_left(self, name: str, what: str) -> None:
        """The gradients on ``name``'s parameters are the plain loop's: ``None``, or what the last step applied."""
        rule = (
            "ZERO-004, ZERO-005: a real step taken under zero_grad_after_step=False leaves the gradients it applied "
            "(the window's own mean plus what it carried, unscaled and clipped) until zero_grad(); a skipped one "
            "clears them"
            if self.leave
            else "ZERO-001: a real step clears the gradients of the wrapper's parameters"
        )
        got = [param.grad for group in self.wrappers[name].optimizer.param_groups for param in group["params"]]
        want = [param.grad for param in self.plain.params(name)]
        assert_grads_close(got, want, self.cell, f"after {what} [{rule}]", reordered=True)

    def assert_params(self, what: str) -> None:
        """Every parameter is the plain loop's, in the cell's tolerance."""
        assert_params_close(self.model, self.oracle, self.cell, what)

    def zero_grad(self, name: str, set_to_none: bool = True) -> None:
        """``wrapper.zero_grad(set_to_none)`` on both sides."""
        self.wrappers[name].zero_grad(set_to_none=set_to_none)
        self.plain.zero_grad(name, set_to_none)

    # -- copies and checkpoints --------------------------------------------------------------------------------

    def checkpoint(self) -> Any:
        """A checkpoint of the implementation's model, optimizers and context, as ``torch.load`` reads it back."""
        return through_a_checkpoint(
            {
                "model": self.model.state_dict(),
                "optimizers": {name: wrapper.state_dict() for name, wrapper in self.wrappers.items()},
                "context": self.context.state_dict(),
            }
        )

    def resume(self, saved: Any) -> None:
        """Go on in fresh objects loaded from a :meth:`checkpoint` (the plain loop goes on as it was)."""
        self.context, self.model, self.wrappers = self._build()
        self.model.load_state_dict(saved["model"])
        for name, wrapper in self.wrappers.items():
            wrapper.load_state_dict(saved["optimizers"][name])
        self.context.load_state_dict(saved["context"])

    def copied(self, how: Literal["pickle", "deepcopy"]) -> tuple[TrainingContext, Halves, dict[str, Any]]:
        """Go on with a copy of the whole training state; returns the original's (context, model, wrappers)."""
        original = (self.context, self.model, self.wrappers)
        self.context, self.model, self.wrappers = (
            pickle.loads(pickle.dumps(original)) if how == "pickle" else copy.deepcopy(original)
        )
        return original
