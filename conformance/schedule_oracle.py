"""Whole training schedules, and a plain-PyTorch oracle that predicts what the contract makes of them.

A :class:`Schedule` is what a user's loop does. One to three optimizers over one model (one head each), each of
a kind (SGD, SGD with momentum, foreach and fused variants, Adam, AdamW), with one or two parameter groups of
different hyper-parameters, sometimes a parameter the forward pass never uses (first in the optimizer) and
parameters frozen before wrapping; an ``accumulate_grad_batches``; configured clipping (norm or value); under
16-mixed, loss-scaler settings that make the scale grow within a few iterations. Then epochs of iterations,
inside ``context.batch`` or outside any batch, and in each iteration some of the optimizers
called once, in some order, with ``make_optimizer_step`` ``True``, ``False`` or ``None``, in the closure form or
the backward-then-step form, sometimes after ``zero_grad()`` (``set_to_none`` either way), sometimes with an
injected non-finite loss (16-mixed), sometimes with a first attempt whose closure raises. Between iterations the
loop may freeze or unfreeze a parameter, add a parameter group to an optimizer (a new parameter that the forward
pass uses from then on), copy the whole training state (pickle or deepcopy) and go on with the copy, or
checkpoint and resume in fresh objects.

:class:`ScheduleOracle` trains the same model with bare optimizers, plain ``torch.autocast`` and, under 16-mixed,
one plain ``torch.amp.GradScaler`` with the schedule's settings, following the rules as the spec states them,
worked out here without any wrapper:

- a call with ``make_optimizer_step=None`` closes its window when ``(batch_idx + 1) % accumulate_grad_batches == 0``
  or when the batch is the last of its epoch; outside any batch, when the window (its earlier micro-steps and this
  one) has ``accumulate_grad_batches`` micro-steps [STEP-003]; ``True`` closes it now, ``False`` accumulates
  [STEP-001, STEP-002];
- a real step applies the mean of the window's micro-batch gradients, whatever its length [ACC-001, ACC-003];
  under 16-mixed the mean is unscaled once [AMP-002], then clipped when the schedule clips, by the total norm
  over all of the optimizer's parameters or element by element [CLIP-001], then ``scaler.step``; a step whose
  unscaled gradients are not finite is skipped, changes nothing and is not counted [AMP-004]; gradients are
  cleared after every real step [ZERO-001]; ``zero_grad()`` with a window open does nothing [ZERO-002];
- while an optimizer's loss is backpropagated, the other heads' parameters do not require grad, and every flag
  (a frozen parameter's too) is what it was afterwards [TOGGLE-001, TOGGLE-002];
- the scaler is updated once per iteration, after every optimizer that stepped in it: inside a batch when the
  block ends, outside any batch right after each real step [AMP-003]; when the scale changes (back-off or growth),
  every gradient a window still holds is rescaled to the new scale [AMP-006] (in a schedule each call runs its
  backward and its step together, so those are the windows left open with micro-steps);
- a call whose closure raises before its backward changes nothing [CLOS-003, FAIL-002]; one that raises after its
  backward changes nothing under ``on_failure="restore"`` [FAIL-004], and under ``"discard"`` discards its
  optimizer's window: every gradient of its parameters ``None``, no micro-step pending, ``last_outcome``
  ``DISCARDED`` until the retry [FAIL-003]; a checkpoint resumed, or a copy taken, between iterations changes nothing
  [CKPT-002, PICKLE-001]: the oracle ignores those.

A schedule with ``zero_grad_after_step=False`` (ZERO-003 to ZERO-007) leaves the gradients of a taken real step on
the parameters (a skipped one clears them, ZERO-004) until ``zero_grad()`` clears them with no window open. The
optimizer's next call takes them aside (its ``step()``, or the wrapper backward of the ``toggle_model`` form: the
other heads are toggled off, so no other call reaches them), and its real step applies them as they are plus the
window's mean: added after the mean and ``unscale_``, before clipping; never rescaled when the scale changes
(neither while left nor while carried) [ZERO-005]. A discarded window loses its carried part; a restored one, or a
call that fails before its backward, leaves them as they were [ZERO-007]. While a window carries, the gradients of
the parameters it carries something for are not pinned (the rule fixes what its step applies, not how the window
holds the two parts meanwhile). Gradients left and not taken are the user's, not state: a copy or a resumed
checkpoint does not hold them, so until the user's ``zero_grad()`` (which :func:`user_clears_after_copies` puts at
each optimizer's next call) the oracle pins none of them either.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal, get_args

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    Batch,
    adam_eps,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    oracle_autocast,
    oracle_step_done,
)
from lightning_optimizer.conformance.plain_loop import (
    Carried,
    clipper,
    params_of,
    plain_scaler,
    real_step,
    scaled_backward,
    take_gradients,
    update_scaler,
)
from lightning_optimizer.spec import Cell, FailurePolicy, GradScalerSettings, StepOutcome

__all__ = [
    "CALL_FORMS",
    "COUPLING",
    "EVENT_KINDS",
    "FREEZABLE",
    "LOSS_FACTOR",
    "OPTIMIZER_KINDS",
    "Call",
    "CallForm",
    "Clipping",
    "Event",
    "EventKind",
    "HeadSpec",
    "Iteration",
    "IterationPosition",
    "OptimizerKind",
    "Schedule",
    "ScheduleHead",
    "ScheduleModel",
    "ScheduleOracle",
    "apply_structure",
    "make_optimizer",
    "schedule_batches",
    "schedule_loss",
    "user_clears_after_copies",
]

OptimizerKind = Literal["sgd", "sgd_momentum", "sgd_foreach", "adam", "adam_foreach", "adam_fused", "adamw"]
"""``sgd``: plain SGD; ``sgd_momentum``: with momentum (and ``foreach=False``); ``sgd_foreach``: with momentum
and ``foreach=True``; ``adam`` (``foreach=False``), ``adam_foreach``, ``adam_fused`` (``fused=True``: under a
GradScaler it skips a non-finite step inside its own kernel); ``adamw``. Adam's state counts the real steps."""
OPTIMIZER_KINDS: Final[tuple[OptimizerKind, ...]] = get_args(OptimizerKind)

CallForm = Literal["closure", "closure_plain_backward", "toggle_model"]
"""How the user code of a call backpropagates: ``step(closure)`` whose closure calls ``wrapper.backward``; the
same with ``loss.backward()`` (never under 16-mixed, where the wrapper must scale); or the backward-then-step
form, ``wrapper.backward`` inside ``with wrapper.toggle_model():`` and then ``step()`` without a closure."""
CALL_FORMS: Final[tuple[CallForm, ...]] = get_args(CallForm)

EventKind = Literal["freeze", "unfreeze", "add_group", "pickle", "deepcopy"]
"""What the loop does between iterations: ``freeze``/``unfreeze`` a parameter of a head (after wrap);
``add_group``: a new parameter, used by the head's forward pass from then on, added to its optimizer as a group of
its own (``add_param_group`` on the wrapper), between its windows; with one open the wrapper refuses it and nothing
is added (WIN-001); ``pickle``/``deepcopy``: go on with a copy of the whole training
state (context, model, wrappers), leaving the original untouched."""
EVENT_KINDS: Final[tuple[EventKind, ...]] = get_args(EventKind)

Clipping = tuple[Literal["norm", "value"], float]
"""``gradient_clip_algorithm`` and ``gradient_clip_val``."""

COUPLING = 0.5
"""Weight of the other heads' outputs in a head's prediction: a missing toggle leaks gradients into them."""
FREEZABLE: Final = (0, 1, 2)
"""The head parameters (weight and bias of the first layer, weight of the second) that a schedule may freeze; the
second layer's bias always takes a gradient, so that no window is ever without one."""
LATE_VALUE = 0.05
"""The initial value of a parameter added by ``add_group``."""


@dataclass(frozen=True)
class HeadSpec:
    """One head of the model and its optimizer."""

    kind: OptimizerKind = "sgd_momentum"
    groups: int = 1
    """1: every parameter in one group; 2: the second layer in a group of its own, with other hyper-parameters."""
    unused: bool = False
    """A parameter the forward pass never uses, first in the optimizer's first group (it never has a gradient)."""
    frozen: frozenset[int] = frozenset()
    """Indices (in :data:`FREEZABLE`) of the head's parameters frozen before the optimizer is wrapped."""


@dataclass(frozen=True)
class Call:
    """One ``step()`` call of one optimizer in an iteration, and what the user code around it does."""

    optimizer: int
    make_optimizer_step: bool | None = None
    form: CallForm = "closure"
    zero_grad_first: bool = False
    """``wrapper.zero_grad(set_to_none=...)`` right before the call (the ``zero_grad(); backward(); step()`` loop)."""
    set_to_none: bool = True
    """The ``set_to_none`` of that ``zero_grad``."""
    non_finite: bool = False
    """The loss is multiplied by infinity (16-mixed only: the window's gradients overflow, its step is skipped)."""
    raises_first: bool = False
    """A first attempt raises inside the closure (or the ``toggle_model`` block) after the forward pass, before
    the backward; the user then repeats the call, which succeeds."""
    raises_after_backward: bool = False
    """With ``raises_first`` in a closure form: the first attempt raises after its backward pass, whose gradients
    must not reach the window [CLOS-003]: under ``"restore"`` it is as before, under ``"discard"`` it is gone."""

    @property
    def fails_after_backward(self) -> bool:
        """The first attempt raises after its backward wrote into the window (a closure form, not a block)."""
        return self.raises_first and self.raises_after_backward and self.form != "toggle_model"


@dataclass(frozen=True)
class Event:
    """What the loop does right before an iteration's calls (see :data:`EventKind`)."""

    kind: EventKind
    head: int = 0
    param: int = 0
    """For ``freeze`` and ``unfreeze``: the index in :data:`FREEZABLE` of the head's parameter."""


@dataclass(frozen=True)
class Iteration:
    """One iteration of the loop: its events, its calls, and whether it runs inside ``context.batch``."""

    calls: tuple[Call, ...]
    events: tuple[Event, ...] = ()
    in_batch: bool = True


@dataclass(frozen=True)
class IterationPosition:
    """One iteration of a schedule: where it is in the loop, its events and the calls it makes."""

    index: int
    """The iteration's position in the whole schedule (0, 1, ... across epochs)."""
    epoch: int
    batch_idx: int | None
    """The iteration's batch index in its epoch; ``None`` outside any batch."""
    is_last: bool
    calls: tuple[Call, ...]
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """A generated training loop: the heads and their optimizers, accumulation, clipping, epochs, checkpoints."""

    heads: tuple[HeadSpec, ...]
    accumulate_grad_batches: int
    epochs: tuple[tuple[Iteration, ...], ...]
    """For each epoch, its iterations in order (each with at most one call per optimizer)."""
    resume_after: frozenset[int] = field(default_factory=frozenset)
    """Iterations (by schedule index) after which the loop checkpoints and resumes in fresh objects."""
    clipping: Clipping | None = None
    grad_scaler: GradScalerSettings | None = None
    """16-mixed only: the loss scaler's settings, given to the factory and to the oracle's ``GradScaler``."""
    zero_grad_after_step: bool = True
    """The context's setting (``False`` only for an implementation that claims ``"user_zero_grad"``, ZERO-003)."""

    @property
    def optimizers(self) -> tuple[OptimizerKind, ...]:
        """The kind of each head's optimizer."""
        return tuple(head.kind for head in self.heads)

    def iterations(self) -> Iterator[IterationPosition]:
        """Every iteration, in order."""
        index = 0
        for epoch, iterations in enumerate(self.epochs):
            in_batch = [i for i, iteration in enumerate(iterations) if iteration.in_batch]
            batch_idx = 0
            for i, iteration in enumerate(iterations):
                position = batch_idx if iteration.in_batch else None
                last = bool(in_batch) and i == in_batch[-1]
                yield IterationPosition(index, epoch, position, last, iteration.calls, iteration.events)
                batch_idx += iteration.in_batch
                index += 1

    @property
    def length(self) -> int:
        """How many iterations the schedule has."""
        return sum(len(iterations) for iterations in self.epochs)


def user_clears_after_copies(schedule: Schedule) -> Schedule:
    """``schedule`` with ``zero_grad()`` before each optimizer's first call after a copy or a resumed checkpoint.

    Under ``zero_grad_after_step=False`` the gradients a real step left and no window took are the user's, not the
    context's state [ZERO-007]: a copy of the training state (``pickle``, ``deepcopy`` drop a parameter's gradient)
    and a resumed checkpoint have none, so the copy continues the original's trajectory where the user clears them,
    as Lightning's ``optimizer_zero_grad`` does at a window's start (a no-op for a window that is open), with
    ``set_to_none=True``: zeros would be the original's alone (an optimizer steps a zero gradient, not a missing
    one). Under ``True`` the schedule is returned as it is.
    """
    if schedule.zero_grad_after_step:
        return schedule
    due: set[int] = set()
    index, epochs = 0, []
    for iterations in schedule.epochs:
        changed = []
        for iteration in iterations:
            if any(event.kind in ("pickle", "deepcopy") for event in iteration.events):
                due = set(range(len(schedule.heads)))
            calls = []
            for call in iteration.calls:
                if call.optimizer in due:
                    due.discard(call.optimizer)
                    call = replace(call, zero_grad_first=True, set_to_none=True)
                calls.append(call)
            changed.append(replace(iteration, calls=tuple(calls)))
            if index in schedule.resume_after:
                due = set(range(len(schedule.heads)))
            index += 1
        epochs.append(tuple(changed))
    return replace(schedule, epochs=tuple(epochs))


class ScheduleHead(torch.nn.Module):
    """A small seeded MLP, an optional parameter it never uses, and the parameters added to it later."""

    def __init__(self, seed: int, spec: HeadSpec) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(3)) if spec.unused else None
        self.net = make_model(seed=seed, sizes=(4, 6, 2))
        self.late = torch.nn.ParameterList()
        for index in spec.frozen:
            self.freezable()[index].requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP's output plus every added parameter."""
        out: torch.Tensor = self.net(x)
        for param in self.late:
            out = out + param
        return out

    def freezable(self) -> list[torch.Tensor]:
        """The parameters a schedule may freeze or unfreeze, indexed as :data:`FREEZABLE`."""
        first, second = self.net[0], self.net[2]
        assert isinstance(first, torch.nn.Linear) and isinstance(second, torch.nn.Linear)
        return [first.weight, first.bias, second.weight]

    def add_late(self) -> torch.nn.Parameter:
        """A new parameter on the head's device and in its dtype, used by the forward pass from now on."""
        param = self.new_late()
        self.late.append(param)
        return param

    def new_late(self) -> torch.nn.Parameter:
        """The parameter :meth:`add_late` adds, not used yet (``self.late.append`` it once its optimizer took it)."""
        like = next(self.net.parameters())
        return torch.nn.Parameter(torch.full((2,), LATE_VALUE, device=like.device, dtype=like.dtype))

    def groups(self, spec: HeadSpec) -> list[list[torch.Tensor]]:
        """The parameters of the optimizer's groups when it is built (the unused one first)."""
        first, second = self.net[0], self.net[2]
        assert isinstance(first, torch.nn.Linear) and isinstance(second, torch.nn.Linear)
        unused: list[torch.Tensor] = [] if self.unused is None else [self.unused]
        layer_one: list[torch.Tensor] = [first.weight, first.bias]
        layer_two: list[torch.Tensor] = [second.weight, second.bias]
        if spec.groups == 1:
            return [unused + layer_one + layer_two]
        return [unused + layer_one, layer_two]


class ScheduleModel(torch.nn.Module):
    """One head per optimizer, seeded; every head's output feeds every head's loss."""

    def __init__(self, heads: Sequence[HeadSpec]) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(ScheduleHead(40 + i, spec) for i, spec in enumerate(heads))

    def head(self, index: int) -> ScheduleHead:
        """Head ``index``."""
        head = self.heads[index]
        assert isinstance(head, ScheduleHead)
        return head


_HYPER: dict[OptimizerKind, dict[str, object]] = {
    "sgd": {"lr": 0.1, "foreach": False},
    "sgd_momentum": {"lr": 0.1, "momentum": 0.9, "foreach": False},
    "sgd_foreach": {"lr": 0.1, "momentum": 0.9, "foreach": True},
    "adam": {"lr": 0.05, "foreach": False},
    "adam_foreach": {"lr": 0.05, "foreach": True},
    "adam_fused": {"lr": 0.05, "fused": True},
    "adamw": {"lr": 0.05, "weight_decay": 0.1, "foreach": False},
}


def make_optimizer(spec: HeadSpec, groups: Sequence[Sequence[torch.Tensor]], cell: Cell) -> torch.optim.Optimizer:
    """The bare optimizer of a head: its kind's hyper-parameters; a second group with half the lr and weight decay.

    Adam and AdamW take the cell's ``eps`` (:func:`~.harness.adam_eps`).
    """
    hyper = dict(_HYPER[spec.kind])
    if not spec.kind.startswith("sgd"):
        hyper["eps"] = adam_eps(cell)
    lr = hyper.pop("lr")
    assert isinstance(lr, float)
    param_groups: list[dict[str, object]] = [{"params": list(groups[0])}]
    if len(groups) > 1:
        param_groups.append({"params": list(groups[1]), "lr": lr / 2, "weight_decay": 0.01})
    if spec.kind.startswith("sgd"):
        return torch.optim.SGD(param_groups, lr=lr, **hyper)  # type: ignore[arg-type]
    if spec.kind == "adamw":
        return torch.optim.AdamW(param_groups, lr=lr, **hyper)  # type: ignore[arg-type]
    return torch.optim.Adam(param_groups, lr=lr, **hyper)  # type: ignore[arg-type]


def late_group(spec: HeadSpec, param: torch.Tensor) -> dict[str, object]:
    """The parameter group that ``add_group`` adds: the new parameter, with twice the kind's lr."""
    lr = _HYPER[spec.kind]["lr"]
    assert isinstance(lr, float)
    return {"params": [param], "lr": 2 * lr}


def apply_structure(
    event: Event, schedule: Schedule, model: ScheduleModel, optimizers: Sequence[torch.optim.Optimizer]
) -> None:
    """Apply a ``freeze``, ``unfreeze`` or ``add_group`` event to a model and its (wrapped or bare) optimizers."""
    head = model.head(event.head)
    if event.kind in ("freeze", "unfreeze"):
        head.freezable()[event.param].requires_grad_(event.kind == "unfreeze")
    elif event.kind == "add_group":
        optimizers[event.head].add_param_group(late_group(schedule.heads[event.head], head.add_late()))


def schedule_batches(schedule: Schedule) -> list[Batch]:
    """One seeded ``(x, y)`` batch per iteration of the schedule, shared by all of its calls."""
    return make_batches(schedule.length, seed=17)


def schedule_loss(
    model: ScheduleModel, head: int, batch: Batch, cell: Cell, *, non_finite: bool = False
) -> torch.Tensor:
    """Head ``head``'s loss on ``batch``: its own output plus ``COUPLING`` times every other head's.

    Run it under the precision's autocast. Only toggling keeps the other heads' gradients out of this loss's
    backward pass. ``non_finite`` multiplies the loss by infinity.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    x, y = (t.to(device=device, dtype=dtype) for t in batch)
    outputs = [net(x) if i == head else COUPLING * net(x) for i, net in enumerate(model.heads)]
    prediction = torch.stack(outputs).sum(dim=0).to(dtype)
    loss = torch.nn.functional.mse_loss(prediction, y) * LOSS_FACTOR
    return loss * math.inf if non_finite else loss


_KIND_NAMES: dict[OptimizerKind, str] = {
    "sgd": "SGD",
    "sgd_momentum": "SGD momentum",
    "sgd_foreach": "SGD foreach",
    "adam": "Adam",
    "adam_foreach": "Adam foreach",
    "adam_fused": "Adam fused",
    "adamw": "AdamW",
}
_FORM_NAMES: dict[CallForm, str] = {
    "closure": "closure, wrapper.backward",
    "closure_plain_backward": "closure, loss.backward",
    "toggle_model": "toggle_model block, then step()",
}
_EVENT_FACTS: dict[EventKind, tuple[str, str]] = {
    "freeze": ("parameters", "frozen after wrap"),
    "unfreeze": ("parameters", "unfrozen after wrap"),
    "add_group": ("param_groups", "added after wrap"),
    "pickle": ("copies", "pickle"),
    "deepcopy": ("copies", "deepcopy"),
}


class ScheduleOracle:
    """The plain-PyTorch run of a schedule: bare optimizers, plain autocast, one plain ``GradScaler``.

    :meth:`begin` applies an iteration's events, :meth:`call` runs one call and returns its outcome, :meth:`end`
    ends the iteration (the scaler's update). Afterwards ``model``, ``optimizers``, ``scaler``, ``steps``,
    ``last_outcomes`` and ``scales`` hold what an implementation must match.
    """

    def __init__(self, schedule: Schedule, cell: Cell, on_failure: FailurePolicy = "discard") -> None:
        self.schedule, self.cell, self.on_failure = schedule, cell, on_failure
        self.model = ScheduleModel(schedule.heads).to(device=cell_device(cell), dtype=cell_dtype(cell))
        self.optimizers = [
            make_optimizer(spec, self.model.head(i).groups(spec), cell) for i, spec in enumerate(schedule.heads)
        ]
        self.scaler: GradScaler | None = plain_scaler(cell, schedule.grad_scaler)
        self.batches = schedule_batches(schedule)
        self.pending = [0] * len(self.optimizers)
        """Micro-steps in each optimizer's open window."""
        self.steps = [0] * len(self.optimizers)
        """Real steps taken by each optimizer (skipped ones do not count)."""
        self.last_outcomes: list[StepOutcome | None] = [None] * len(self.optimizers)
        """Each optimizer's last call's outcome."""
        self.scales: list[float] = []
        """The factor of every backward pass so far: the gradient reaching its loss (1.0 without a scaler, the scale
        over ``accumulate_grad_batches`` with one)."""
        self.facts: set[tuple[str, str]] = set()
        """What the schedule exercised, as ``(dimension, value)`` pairs of ``dimensions.DIMENSIONS``."""
        self.left = [False] * len(self.optimizers)
        """``zero_grad_after_step=False``: each optimizer's gradients are what its last taken real step left."""
        self.carried: list[Carried | None] = [None] * len(self.optimizers)
        """``zero_grad_after_step=False``: what each optimizer's open window took from its last taken real step."""
        self.users = [False] * len(self.optimizers)
        """Left gradients a copy or a resumed checkpoint does not hold (the user's, until ``zero_grad()``)."""
        self._stepped = False
        self._epoch = 0
        self._copied = False
        self._record_schedule()

    def _record_schedule(self) -> None:
        facts, schedule = self.facts, self.schedule
        facts.add(("wrappers", str(len(schedule.heads))))
        facts.add(("zero_grad_after_step", str(schedule.zero_grad_after_step)))
        facts.add(("outcome_read", "after every call of every wrapper"))
        for spec in schedule.heads:
            facts.add(("optimizer", _KIND_NAMES[spec.kind]))
            facts.add(("param_groups", "1" if spec.groups == 1 else "2 with other hyper-parameters"))
            if spec.frozen:
                facts.add(("parameters", "frozen"))
        if schedule.clipping is not None:
            facts.add(("clipping", schedule.clipping[0]))
        if self.scaler is not None:
            facts.add(("loss_scale", "initial"))
            if schedule.grad_scaler is not None:
                facts.add(("loss_scale", "settings given to the factory"))
        if schedule.resume_after:
            facts.add(("copies", "checkpoint"))

    def iteration(self, position: IterationPosition) -> list[StepOutcome]:
        """Run one iteration whole; return each call's outcome, in call order."""
        self.begin(position)
        outcomes = [self.call(position, call) for call in position.calls]
        self.end(position)
        return outcomes

    def begin(self, position: IterationPosition) -> None:
        """Apply the iteration's structural events (copies are the implementation's business)."""
        if position.epoch != self._epoch:
            self._epoch = position.epoch
            if any(self.pending):
                self.facts.add(("window", "open across epochs"))
        self.facts.add(("position", "inside batch()" if position.batch_idx is not None else "outside batch()"))
        for event in position.events:
            if event.kind == "add_group" and self.pending[event.head]:
                self.facts.add(("outside_change", "add_param_group on the wrapper"))
                continue  # refused with the window open, and nothing added [WIN-001]
            apply_structure(event, self.schedule, self.model, self.optimizers)
            self.facts.add(_EVENT_FACTS[event.kind])
            if event.kind in ("pickle", "deepcopy"):
                self._copied = True
                self.users = list(self.left)  # the copy does not hold them [ZERO-007]

    def end(self, position: IterationPosition) -> None:
        """End the iteration: the scaler's one update if an optimizer stepped, open windows rescaled."""
        if self.scaler is not None and self._stepped:
            self._update()
        if position.index in self.schedule.resume_after:
            self.users = list(self.left)  # the resumed checkpoint does not hold them [ZERO-007]

    def unpinned(self) -> tuple[frozenset[int], frozenset[int]]:
        """Which gradients (indices into ``model.parameters()``) no rule pins now, and which a step left.

        Not pinned: those a window carries something for while it is open (how it holds its two parts meanwhile is
        its own), and the user's left gradients that a copy or a resumed checkpoint lacks. Left: what a taken real
        step left, unscaled (never compared at another loss scale).
        """
        carrying = {id(param) for carried in self.carried if carried for param in carried}
        users = {
            id(p) for i, opt in enumerate(self.optimizers) if self.users[i] and self.left[i] for p in params_of(opt)
        }
        left = {id(p) for i, opt in enumerate(self.optimizers) if self.left[i] for p in params_of(opt)}
        params = list(self.model.parameters())
        return (
            frozenset(i for i, param in enumerate(params) if id(param) in carrying | users),
            frozenset(i for i, param in enumerate(params) if id(param) in left),
        )

    def _update(self) -> None:
        assert self.scaler is not None
        self._stepped = False
        # Every gradient a window still holds (each once, should two optimizers share a parameter); not what a real
        # step left, which is unscaled, nor what a window carries, which is aside [ZERO-005].
        held = {
            id(param): param
            for i, optimizer in enumerate(self.optimizers)
            if not self.left[i]
            for param in params_of(optimizer)
        }
        change = update_scaler(self.scaler, held.values())
        if change != 1.0:
            self.facts.add(("loss_scale", "grown" if change > 1.0 else "backed off"))
            if self._copied:
                self.facts.add(("copies", "copy then overflow or growth"))
            if any(self.pending):
                self.facts.add(("window", "open across a scale change"))

    def _closes(self, position: IterationPosition, call: Call) -> bool:
        if call.make_optimizer_step is not None:
            return call.make_optimizer_step
        n = self.schedule.accumulate_grad_batches
        if position.batch_idx is None:
            return self.pending[call.optimizer] + 1 >= n
        return (position.batch_idx + 1) % n == 0 or position.is_last

    def call(self, position: IterationPosition, call: Call) -> StepOutcome:
        """One call: its forward and backward pass, then accumulation or the real step; its outcome."""
        index = call.optimizer
        optimizer = self.optimizers[index]
        self._record_call(position, call)
        if call.zero_grad_first and self.pending[index] == 0:
            optimizer.zero_grad(set_to_none=call.set_to_none)  # what the last step left goes too [ZERO-005]
            self.left[index] = self.users[index] = False
        if self.left[index]:  # the window's first micro-step takes what the last taken step left [ZERO-005]
            self.carried[index] = take_gradients(params_of(optimizer)) or None
            self.left[index] = self.users[index] = False
        if call.fails_after_backward and self.on_failure == "discard":
            self.discard(index)
        self._backward(position, call)
        if not self._closes(position, call):
            self.pending[index] += 1
            self.last_outcomes[index] = StepOutcome.ACCUMULATED
            return StepOutcome.ACCUMULATED
        window = self.pending[index] + 1
        self._record_real_step(position, call, window)
        # The window's mean [ACC-001], unscaled [AMP-002], clipped [CLIP-001], stepped (or skipped [AMP-004]).
        clip = None if self.schedule.clipping is None else clipper(*self.schedule.clipping)
        n = self.schedule.accumulate_grad_batches
        if self.carried[index]:
            self.facts.add(("window", "carrying the last step's gradients"))
        clear = self.schedule.zero_grad_after_step
        finite = real_step(
            optimizer,
            window,
            self.scaler,
            n,
            clip=clip,
            check_finite=self.scaler is not None,
            carried=self.carried[index],
            clear=clear,
        )
        self.carried[index] = None
        self.left[index] = not clear and finite  # a skipped step clears under both settings [ZERO-004]
        self._stepped = self.scaler is not None
        oracle_step_done(self.cell)
        self.pending[index] = 0
        self.steps[index] += finite
        outcome = StepOutcome.STEPPED if finite else StepOutcome.SKIPPED_NON_FINITE
        self.last_outcomes[index] = outcome
        if self.scaler is not None and position.batch_idx is None:
            self._update()  # outside any batch every real step ends an iteration [AMP-003]
        return outcome

    def discard(self, index: int) -> None:
        """Optimizer ``index``'s window is discarded by a failed call [FAIL-003]: no gradient, no micro-step."""
        for param in params_of(self.optimizers[index]):
            param.grad = None
        self.pending[index] = 0
        self.carried[index] = None  # the carried part goes with the window [ZERO-007]
        self.left[index] = self.users[index] = False
        self.last_outcomes[index] = StepOutcome.DISCARDED

    def _record_call(self, position: IterationPosition, call: Call) -> None:
        facts, index = self.facts, call.optimizer
        facts.add(("make_optimizer_step", str(call.make_optimizer_step)))
        facts.add(("call_form", _FORM_NAMES[call.form]))
        if call.zero_grad_first:
            facts.add(("zero_grad", f"set_to_none={call.set_to_none}"))
            if self.pending[index]:
                facts.add(("zero_grad", "with a window open"))
            if any(pending for i, pending in enumerate(self.pending) if i != index):
                facts.add(("zero_grad", "of another wrapper"))
        if call.raises_first:
            facts.add(("faults", "raising toggle_model block" if call.form == "toggle_model" else "raising closure"))
            facts.add(("on_failure", self.on_failure))
        if call.fails_after_backward:
            facts.add(("faults", "raising closure after its backward"))

    def _record_real_step(self, position: IterationPosition, call: Call, window: int) -> None:
        facts, n = self.facts, self.schedule.accumulate_grad_batches
        facts.add(("window", "1 micro-step" if window == 1 else "k >= 2 micro-steps"))
        if any(pending for i, pending in enumerate(self.pending) if i != call.optimizer):
            facts.add(("window", "open while another optimizer steps"))
        if position.batch_idx is not None:
            on_schedule = (position.batch_idx + 1) % n == 0
            if call.make_optimizer_step is True and not on_schedule and not position.is_last:
                facts.add(("window", "cut short by True"))
            if call.make_optimizer_step is None and position.is_last and not on_schedule:
                facts.add(("window", "partial, flushed by the last batch"))
        params = params_of(self.optimizers[call.optimizer])
        if any(param.grad is None for param in params):
            facts.add(("parameters", "no gradient in a window"))

    def _backward(self, position: IterationPosition, call: Call) -> None:
        """The call's forward and backward pass, with only its own optimizer's parameters requiring grad."""
        own = {id(param) for param in params_of(self.optimizers[call.optimizer])}
        others = [
            param
            for i, optimizer in enumerate(self.optimizers)
            if i != call.optimizer
            for param in params_of(optimizer)
            if id(param) not in own and param.requires_grad
        ]
        for param in others:
            param.requires_grad_(False)
        try:
            with oracle_autocast(self.cell):
                loss = schedule_loss(
                    self.model, call.optimizer, self.batches[position.index], self.cell, non_finite=call.non_finite
                )
            loss.register_hook(lambda grad: self.scales.append(float(grad)))  # the factor it is backpropagated by
            scaled_backward(loss, self.scaler, self.schedule.accumulate_grad_batches)
        finally:
            for param in others:
                param.requires_grad_(True)
