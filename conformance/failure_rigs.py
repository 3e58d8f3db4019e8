"""The rig of the checks of failed and refused calls: two halves, their wrappers, what a failure leaves, the oracle.

:class:`Rig` builds a context over :class:`.harness.Halves` with one wrapper per half, each around an optimizer of
:data:`KINDS` (a flaky one: its inner step raises while told to), and the oracle's copy of the model taken before
the context prepares it. :meth:`Rig.fails` runs a call that must raise and checks what the failure policy leaves;
:func:`run_epoch` runs one epoch of a :class:`FailurePlan`, in which one call fails once; :meth:`Rig.train_oracle`
is the plain PyTorch loop over the windows a check worked out by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any, NamedTuple

import torch

from lightning_optimizer.conformance.assertions import (
    Snapshot,
    assert_same_grads,
    assert_unchanged,
    cloned,
    grads,
    snapshot,
    state_diff,
)
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    Batch,
    FlakyAdam,
    FlakySGD,
    Halves,
    PlannedFailure,
    adam_eps,
    assert_discard_note,
    assert_params_close,
    cell_device,
    cell_dtype,
    mse,
    oracle_step_done,
    refuses,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    clipper,
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome

__all__ = ["ADAM_LR", "EAGER", "GROWING", "KINDS", "SGD_LR", "FailurePlan", "Kind", "Rig", "run_epoch"]

EAGER = ("cpu", "cuda")
"""Where the checks that train windows against an oracle run: no rule here depends on the device, and on XLA every
new graph compiles (the checks that only construct or refuse run there too)."""
SGD_LR = 10.0
"""Large enough that a window's mean over a wrong length, a micro-batch too many or a gradient left scaled moves the
parameters far beyond every precision's tolerance."""
ADAM_LR = 0.01
GROWING = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
"""The scale doubles after every iteration in which an optimizer stepped and nothing overflowed, and halves after one
that recorded an overflow: an update too many, too few or with a found-inf kept of a failed window shows."""
Kind = tuple[type[torch.optim.Optimizer], type[torch.optim.Optimizer], dict[str, Any]]
"""An optimizer for the wrapper, its plain twin for the oracle, and their hyper-parameters."""
KINDS: dict[str, Kind] = {
    "SGD": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR}),
    "SGD momentum": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR, "momentum": 0.9}),
    "Adam": (FlakyAdam, torch.optim.Adam, {"lr": ADAM_LR}),
}
"""The flaky optimizer of each kind (its step raises while ``fail`` is set), and its plain twin for the oracle."""


def _with_eps(kind: Kind, cell: Cell) -> Kind:
    """An Adam kind with the cell's ``eps`` on both sides (:func:`~.harness.adam_eps`); other kinds as they are."""
    flaky, plain, hyper = kind
    return (flaky, plain, hyper | {"eps": adam_eps(cell)}) if issubclass(plain, torch.optim.Adam) else kind


class Rig:
    """A context, ``Halves(*seeds)`` prepared, a wrapper per half: the flaky optimizer of ``kinds[i]`` on ``"ab"[i]``.

    ``oracle``: the model's copy, taken before the context prepared it; ``scales``: each recorded backward's batch and
    scale (16-mixed); ``ran``: the names of the closures that ran.
    """

    def __init__(
        self,
        make_context: Callable[..., Any],
        cell: Cell,
        batches: list[Batch],
        kinds: Sequence[str | Kind] = ("SGD", "SGD"),
        seeds: tuple[int, int] = (61, 62),
        **settings: Any,
    ) -> None:
        self.cell, self.batches, self.settings = cell, batches, settings
        self.context = make_context(**settings)
        base = Halves(*seeds)
        oracle = oracle_copy(base, cell)
        assert isinstance(oracle, Halves)
        self.oracle, self.model = oracle, self.context.prepare_module(base)
        self.kinds = {
            name: _with_eps(KINDS[kind] if isinstance(kind, str) else kind, cell)
            for name, kind in zip("ab", kinds, strict=False)
        }
        self.halves: dict[str, torch.nn.Module] = {name: getattr(self.model, name) for name in self.kinds}
        self.inner = {
            name: flaky(self.halves[name].parameters(), **hyper) for name, (flaky, _, hyper) in self.kinds.items()
        }
        self.wrappers: dict[str, Any] = {name: self.context.wrap(inner) for name, inner in self.inner.items()}
        self.scales: list[tuple[int, float]] = []
        self.ran: list[str] = []

    def loss(self, name: str, batch_idx: int, *, record: bool = True) -> torch.Tensor:
        """Half ``name``'s loss on batch ``batch_idx`` under the context's autocast (its scale recorded)."""
        with self.context.autocast():
            batch = self.batches[batch_idx]
            loss = mse(self.halves[name], batch, cell_device(self.cell), cell_dtype(self.cell)) * LOSS_FACTOR
        if record and self.cell.precision == "16-mixed":
            loss.register_hook(lambda grad: self.scales.append((batch_idx, float(grad))))
        return loss

    def closure(
        self,
        name: str,
        batch_idx: int,
        *,
        plain: bool = False,
        unscale: bool = False,
        fail: bool = False,
        record: bool = True,
    ) -> Callable[[], torch.Tensor]:
        """``step``'s closure: the forward, ``wrapper.backward``; then ``unscale_gradients()`` or a raise if asked.

        ``plain``: ``loss.backward()`` instead; ``unscale``: ``unscale_gradients()`` after it; ``fail``: then raise
        :class:`PlannedFailure`.
        """

        def closure() -> torch.Tensor:
            self.ran.append(name)
            loss = self.loss(name, batch_idx, record=record)
            loss.backward() if plain else self.wrappers[name].backward(loss)
            if unscale:
                self.wrappers[name].unscale_gradients()
            if fail:
                raise PlannedFailure("the closure fails after its backward")
            return loss

        return closure

    def call(
        self,
        name: str,
        batch_idx: int,
        make_step: bool | None = None,
        *,
        form: str = "closure",
        unscale: bool = False,
        backward: bool = True,
    ) -> None:
        """A micro-step of wrapper ``name`` in ``form``: ``"closure"``, ``"plain"`` or ``"backward"``, then ``step()``.

        ``backward=False``: ``step()`` alone; ``unscale``: the window prepared by ``unscale_gradients()`` first.
        """
        wrapper = self.wrappers[name]
        if form != "backward":
            wrapper.step(
                self.closure(name, batch_idx, plain=form == "plain", unscale=unscale), make_optimizer_step=make_step
            )
            return
        if backward:
            wrapper.backward(self.loss(name, batch_idx))
            if unscale:
                wrapper.unscale_gradients()
        wrapper.step(make_optimizer_step=make_step)

    def batch(self, batch_idx: int, *names: str) -> None:
        """Batch ``batch_idx``'s ``batch()`` block, in which wrappers ``names``, in order, each take a :meth:`call`."""
        with self.context.batch(batch_idx):
            for name in names:
                self.call(name, batch_idx)

    @contextmanager
    def inner_fails(self, name: str = "a") -> Iterator[None]:
        """In the block, wrapper ``name``'s inner optimizer's ``step`` raises :class:`PlannedFailure`."""
        self.inner[name].fail = True  # type: ignore[attr-defined]
        try:
            yield
        finally:
            self.inner[name].fail = False  # type: ignore[attr-defined]

    @contextmanager
    def hook_raises(self, hook: str, only: str | None = None) -> Iterator[None]:
        """In the block, a ``hook`` registered that raises :class:`PlannedFailure` (for wrapper ``only``'s calls)."""

        def raising(wrapper: Any, *args: Any) -> None:
            if only is None or wrapper is self.wrappers[only]:
                raise PlannedFailure(f"the {hook} hook fails (planted by the check)")

        handle = self.context.register_hooks(**{hook: raising})
        try:
            yield
        finally:
            handle.remove()

    def fails(
        self,
        what: str,
        why: str,
        call: Callable[[], object],
        *,
        raised: type[BaseException] = PlannedFailure,
        discarded: str | None = None,
        held: int | None = None,
        state: bool = False,
    ) -> BaseException:
        """``call()`` raises ``raised`` (:func:`.harness.refuses`), and everything is as it was [FAIL-002, FAIL-004].

        Parameters, gradients, flags, every wrapper's ``last_outcome`` and, with ``state``, the context's state;
        except wrapper ``discarded``'s window, gone [FAIL-003]: every gradient ``None``, ``DISCARDED``, the state not
        compared, the exception's note counting ``held`` or ``held + 1`` micro-steps (where ``held`` is given).
        """
        want, outcomes = snapshot(self.model), self._outcomes()
        saved = cloned(self.context.state_dict()) if state else None
        with refuses(raised, what, why) as error:
            call()
        if discarded is not None:
            gone = {id(param) for param in self.halves[discarded].parameters()}
            kept = [None if id(p) in gone else g for p, g in zip(self.model.parameters(), want.grads, strict=True)]
            want, outcomes = Snapshot(want.values, kept, want.flags), outcomes | {discarded: StepOutcome.DISCARDED}
        assert_unchanged(
            self.model, want, what if discarded is None else f"{what}, wrapper {discarded}'s window discarded"
        )
        assert self._outcomes() == outcomes, f"{what}: the outcomes are {self._outcomes()}, expected {outcomes}"
        if saved is not None and discarded is None:
            problem = state_diff(self.context.state_dict(), saved)
            assert problem is None, f"{what}: context.state_dict(): {problem}"
        if discarded is not None and held is not None:
            assert_discard_note(error.value, self.inner[discarded], (held, held + 1), what)
        return error.value

    def _outcomes(self) -> dict[str, StepOutcome | None]:
        return {name: wrapper.last_outcome for name, wrapper in self.wrappers.items()}

    def train_oracle(
        self, windows: Mapping[str, Sequence[Sequence[int]]], *, in_batch: bool = True
    ) -> tuple[list[float], list[bool]]:
        """The plain loop over each wrapped half's ``windows`` (indices into ``batches``) in the rig's settings.

        Per batch, each half in order backpropagates if one of its windows holds the batch, and steps on the window's
        mean (unscaled, clipped by norm to ``gradient_clip_val``) at its last batch; one ``GradScaler`` (torch's
        recipe, AMP-007), updated at the end of each batch in which an optimizer stepped (``in_batch``) or after each
        real step (AMP-003). Returns each backward's scale (16-mixed) and, per real step, whether it stepped.
        """
        scaler = plain_scaler(self.cell, self.settings.get("grad_scaler"))
        clip = self.settings.get("gradient_clip_val")
        clip_norm = None if clip is None else clipper("norm", clip)
        accumulate = self.settings.get("accumulate_grad_batches", 1)
        oracle: dict[str, torch.nn.Module] = {name: getattr(self.oracle, name) for name in self.kinds}
        optimizers = {name: plain(oracle[name].parameters(), **hyper) for name, (_, plain, hyper) in self.kinds.items()}
        scales: list[float] = []
        stepped: list[bool] = []
        for batch_idx, batch in enumerate(self.batches):
            steps = 0
            for name, optimizer in optimizers.items():
                window = next((w for w in windows[name] if batch_idx in w), None)
                if window is None:
                    continue
                scaled_backward(oracle_loss(oracle[name], batch, self.cell), scaler, accumulate, scales=scales)
                if batch_idx == window[-1]:
                    real_step(optimizer, len(window), scaler, accumulate, clip=clip_norm)
                    steps += 1
                    stepped += [] if in_batch else [update_scaler(scaler) >= 1.0]
                    oracle_step_done(self.cell)
            if steps and in_batch:
                stepped += [update_scaler(scaler) >= 1.0] * steps
        return scales, stepped

    def assert_oracle(self, what: str) -> None:
        """Each wrapped half's parameters within the cell's tolerance of the oracle's (after :meth:`train_oracle`)."""
        for name, half in self.halves.items():
            assert_params_close(half, getattr(self.oracle, name), self.cell, f"{what}, half {name}")


class FailurePlan(NamedTuple):
    """An epoch in which wrapper ``a``'s call of batch ``failing`` fails once, after its window was written.

    Wrapper ``b`` (with ``other``, its schedule) is called after ``a`` in each batch.
    ``form``: ``"closure"``, ``"plain"`` (``loss.backward()``: the failing closure always, the others outside
    16-mixed) or ``"backward"`` (backward, then ``step()``). ``where``: ``"closure"`` (the closure raises after its
    backward), ``"prepared closure"`` (after its backward and ``unscale_gradients()``), ``"hook"``
    (``before_optimizer_step`` raises), ``"inner"`` (the inner step raises), ``"prepared"`` (``unscale_gradients()``
    first, then the inner step raises). ``held``: micro-steps the window held before the failing call. ``retry``:
    ``"same"`` (the call again), ``"skip"`` (none: the next batch's call goes on) or ``"accumulate"`` (the micro-batch
    again with ``make_optimizer_step=False``). ``windows`` and ``outcomes`` (``a``'s ``last_outcome`` after each
    batch) are worked out by hand for the policy the plan is checked under.
    """

    accumulate: int
    kind: str
    form: str
    where: str
    batches: int
    failing: int
    held: int
    windows: tuple[tuple[int, ...], ...]
    outcomes: tuple[StepOutcome, ...]
    schedule: Mapping[int, bool | None] = {}
    in_batch: bool = True
    retry: str = "same"
    other: tuple[bool | None, ...] | None = None
    other_windows: tuple[tuple[int, ...], ...] = ()
    clip: float | None = None


def run_epoch(rig: Rig, plan: FailurePlan, what: str, on_failure: str = "discard", state: bool = False) -> list[Any]:
    """The plan's epoch on ``rig``; returns ``a``'s ``last_outcome`` after each batch.

    The failing call is checked by :meth:`Rig.fails` under ``on_failure`` (the context's state compared with
    ``state``, unless the window was prepared); a prepared window's ``zero_grad()`` is taken once it is discarded,
    refused once it is restored [CLIP-002].
    """
    a, discard, outcomes = rig.wrappers["a"], on_failure == "discard", []
    form = "closure" if plan.form == "plain" and rig.cell.precision == "16-mixed" else plan.form
    prepared = plan.where in ("prepared", "prepared closure")
    for i in range(plan.batches):
        block = rig.context.batch(i, is_last=i == plan.batches - 1) if plan.in_batch else nullcontext()
        with block:
            make_step = plan.schedule.get(i)
            if i != plan.failing:
                rig.call("a", i, make_step, form=form)
            else:
                if plan.form == "backward":
                    a.backward(rig.loss("a", i, record=not discard))
                    if prepared:
                        a.unscale_gradients()
                    failing = partial(a.step, make_optimizer_step=make_step)
                else:
                    fail = plan.where in ("closure", "prepared closure")
                    closure = rig.closure(
                        "a",
                        i,
                        plain=plan.form == "plain",
                        unscale=plan.where == "prepared closure",
                        fail=fail,
                        record=False,
                    )
                    failing = partial(a.step, closure, make_optimizer_step=make_step)
                planted: AbstractContextManager[None] = nullcontext()
                if plan.where == "hook":
                    planted = rig.hook_raises("before_optimizer_step", only="a")
                elif plan.where in ("inner", "prepared"):
                    planted = rig.inner_fails()
                with planted:
                    why = "CLOS-003, TXN-001, HOOK-004: the failure propagates"
                    rig.fails(
                        what,
                        why,
                        failing,
                        discarded="a" if discard else None,
                        held=plan.held,
                        state=state and not prepared,
                    )
                if prepared and discard:
                    a.zero_grad()  # the discarded window is not prepared any more: zero_grad() is taken
                    window = grads(rig.halves["a"].parameters())
                    assert_same_grads(window, [None] * len(window), f"{what}, then zero_grad()")
                elif prepared:
                    why = "CLIP-002, FAIL-004: the restored window is still prepared; zero_grad() is refused"
                    rig.fails(f"wrapper a's zero_grad() after {what}", why, a.zero_grad, raised=RuntimeError)
                if plan.retry == "same":
                    rig.call("a", i, make_step, form=form, unscale=prepared, backward=discard)
                elif plan.retry == "accumulate":
                    rig.call("a", i, False, form=form)
            outcomes.append(a.last_outcome)
            if plan.other is not None:
                rig.call("b", i, plan.other[i])
    return outcomes
