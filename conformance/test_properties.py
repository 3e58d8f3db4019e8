"""Property checks: generated training schedules against the plain-PyTorch schedule oracle.

Hypothesis generates whole loops (:class:`~lightning_optimizer.conformance.schedule_oracle.Schedule`): one to
three optimizers of every kind the oracle knows (SGD, with momentum, foreach and fused variants, Adam, AdamW), one
or two parameter groups with other hyper-parameters, parameters the forward pass never uses and parameters frozen
before wrapping; ``accumulate_grad_batches`` 1 to 4; configured clipping by norm or by value; under 16-mixed,
loss-scaler settings (given to the factory) that make the scale grow within a few iterations, and injected
non-finite losses that make it back off; epochs whose length leaves partial windows, and iterations outside any
``context.batch`` (where, under 16-mixed, the scaler updates after each real step); per call
``make_optimizer_step`` ``True``/``False``/``None``, the closure form (``wrapper.backward`` or ``loss.backward()``)
or the backward-then-step form, ``zero_grad()`` with ``set_to_none`` either way; between iterations parameters
frozen and unfrozen after wrap, parameter groups added after wrap, copies of the whole training state (pickle,
deepcopy) that go on while the original must stay as it was, closures that raise, and checkpoints resumed in fresh
objects.

After every call the implementation's outcome, every wrapper's ``last_outcome`` and every parameter's gradient (the
open windows') must be the oracle's; after every iteration its parameters, gradients and loss scales; at the end
its optimizer state and loss-scaler state. The closure runs once per call, under the context's autocast.

The suite runs a fixed, derandomised budget per cell (``CI_EXAMPLES``; ``--property-examples=N`` runs ``N``
schedules per check, and shrinks a failing one to a minimal example). The checks run on the eager devices at
world size 1: on XLA every generated schedule compiles new graphs (minutes per cell), and the DDP ranks run in
the rank pool's processes, where the DDP checks cover what world size 2 adds (``no_sync``, identical ranks).
``GENERATED`` is what the generator draws (the checks' ``varies`` marker); ``tests/test_dimensions.py`` checks that
the CI budget reaches every value of it.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    Snapshot,
    assert_same_values,
    assert_unchanged,
    cloned,
    grad_scaler_states,
    grads,
    identical,
    outcome_names,
    param_values,
    snapshot,
    state_diff,
)
from lightning_optimizer.conformance.dimensions import DIMENSIONS
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    REORDERED_TOLERANCES,
    Batch,
    assert_discard_note,
    assert_params_close,
    cell_device,
    failure_settings,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.schedule_oracle import (
    CALL_FORMS,
    FREEZABLE,
    OPTIMIZER_KINDS,
    Call,
    CallForm,
    Clipping,
    Event,
    EventKind,
    HeadSpec,
    Iteration,
    IterationPosition,
    Schedule,
    ScheduleModel,
    ScheduleOracle,
    apply_structure,
    make_optimizer,
    schedule_batches,
    schedule_loss,
)
from lightning_optimizer.spec import (
    Cell,
    FailurePolicy,
    GradScalerSettings,
    OptimizerWrapper,
    StepOutcome,
    TrainingContext,
)

try:
    import hypothesis.configuration
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import strategies as st

    HYPOTHESIS_MISSING: str | None = None
except ImportError as exc:  # the suite's other checks run without it
    HYPOTHESIS_MISSING = f"hypothesis is not installed ({exc}); pip install hypothesis"

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn, SearchStrategy

MakeContext = Callable[..., TrainingContext]
REAL_STEP = (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)
EAGER = ("cpu", "cuda")

CI_EXAMPLES = {"oracle": 60, "faults": 40, "resume": 25, "ranks": 5}
"""Generated schedules per check and cell in a plain run (besides the explicit examples)."""

CLIPPINGS: tuple[Clipping, ...] = (("norm", 1.5e-3), ("value", 5e-4))
"""Thresholds that clip some of the schedule model's window gradients (norms ~1e-3 to 6e-3) and not others."""

GENERATED: dict[str, tuple[str, ...]] = {
    **{
        dimension: DIMENSIONS[dimension]  # every value of these
        for dimension in ("window", "make_optimizer_step", "position", "wrappers", "param_groups", "zero_grad")
    },
    "optimizer": tuple(  # the torch optimizers the schedules draw (the others have checks of their own)
        kind for kind in DIMENSIONS["optimizer"] if kind not in ("LBFGS", "step(closure) recorded", "two-pass (SAM)")
    ),
    "parameters": ("frozen", "frozen after wrap", "unfrozen after wrap", "no gradient in a window"),
    "call_form": ("closure, wrapper.backward", "closure, loss.backward", "toggle_model block, then step()"),
    "outcome_read": ("after every call of every wrapper",),
    "clipping": ("norm", "value"),
    "loss_scale": DIMENSIONS["loss_scale"],
    "copies": ("pickle", "deepcopy", "copy then overflow or growth"),
}
"""What the generator of the oracle check draws, as ``dimensions.DIMENSIONS`` names it."""
FAULTS_GENERATED = GENERATED | {
    "faults": ("raising closure", "raising closure after its backward", "raising toggle_model block"),
    "on_failure": ("discard", "restore"),
}
"""The generator of the check with raising closures draws those too, and the check runs under both policies."""
RESUME_GENERATED = GENERATED | {"copies": ("checkpoint",)}
"""The resume check's generator: checkpoints instead of copies."""


class ScheduleFault(RuntimeError):
    """What a generated closure raises on purpose."""


# -- driving an implementation through a schedule ------------------------------------------------------------


@dataclass
class _Subject:
    """The implementation under test, set up for one schedule."""

    context: TrainingContext
    model: ScheduleModel
    wrappers: list[OptimizerWrapper[Any]]
    on_failure: str = "discard"
    known_outcomes: list[bool] = field(default_factory=list)
    """Per wrapper: whether its ``last_outcome`` is pinned (it was called since it was built, resumed or copied)."""

    def __post_init__(self) -> None:
        self.known_outcomes = [False] * len(self.wrappers)

    @classmethod
    def build(cls, make_context: MakeContext, schedule: Schedule, cell: Cell, on_failure: str = "discard") -> _Subject:
        kwargs: dict[str, Any] = {"accumulate_grad_batches": schedule.accumulate_grad_batches}
        kwargs.update(failure_settings(on_failure))
        if schedule.clipping is not None:
            kwargs.update(gradient_clip_algorithm=schedule.clipping[0], gradient_clip_val=schedule.clipping[1])
        if schedule.grad_scaler is not None and cell.precision == "16-mixed":
            kwargs.update(grad_scaler=schedule.grad_scaler)
        context = make_context(**kwargs)
        model = context.prepare_module(ScheduleModel(schedule.heads))
        assert isinstance(model, ScheduleModel), f"prepare_module returned a {type(model).__name__} at world size 1"
        wrappers = [
            context.wrap(make_optimizer(spec, model.head(i).groups(spec))) for i, spec in enumerate(schedule.heads)
        ]
        return cls(context, model, wrappers, on_failure)

    def apply(self, event: Event, schedule: Schedule) -> None:
        """A structural event (freeze, unfreeze, add_group) through the wrappers, as a user's loop does it."""
        # The wrappers are torch.optim.Optimizer instances at run time [PROXY-001].
        apply_structure(event, schedule, self.model, cast(list[torch.optim.Optimizer], self.wrappers))

    def resumed(self, make_context: MakeContext, schedule: Schedule, cell: Cell, structure: list[Event]) -> _Subject:
        """Checkpoint (model, each wrapper's ``state_dict``, the context's), then load it into fresh objects.

        The fresh objects repeat the structure the loop built so far (frozen flags, added groups) before loading.
        """
        buffer = io.BytesIO()
        state = {
            "model": self.model.state_dict(),
            "optimizers": [wrapper.state_dict() for wrapper in self.wrappers],
            "context": self.context.state_dict(),
        }
        torch.save(state, buffer)
        fresh = _Subject.build(make_context, schedule, cell, self.on_failure)
        for event in structure:
            fresh.apply(event, schedule)
        saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        fresh.model.load_state_dict(saved["model"])
        for wrapper, optimizer_state in zip(fresh.wrappers, saved["optimizers"], strict=True):
            wrapper.load_state_dict(optimizer_state)
        fresh.context.load_state_dict(saved["context"])
        return fresh

    def copied(self, how: str) -> _Subject:
        """A copy of the whole training state (context, model, wrappers), by pickle or deepcopy."""
        state = (self.context, self.model, self.wrappers)
        context, model, wrappers = pickle.loads(pickle.dumps(state)) if how == "pickle" else copy.deepcopy(state)
        return _Subject(context, model, wrappers, self.on_failure)

    def call(self, call: Call, batch: Batch, cell: Cell, scales: list[float], held: int) -> StepOutcome | None:
        """One call of the schedule (after a first attempt that raises, when the call says so).

        ``held``: the micro-steps the call's window holds before it (what a discarded window's note counts).
        """
        wrapper = self.wrappers[call.optimizer]
        if call.zero_grad_first:
            if call.set_to_none:
                wrapper.zero_grad()
            else:
                wrapper.zero_grad(set_to_none=False)
        if call.raises_first:
            self._raising_attempt(call, batch, cell, held)
        self._attempt(call, batch, cell, scales, raising=False)
        self.known_outcomes[call.optimizer] = True
        return wrapper.last_outcome

    def _attempt(self, call: Call, batch: Batch, cell: Cell, scales: list[float], *, raising: bool) -> None:
        wrapper = self.wrappers[call.optimizer]
        runs: list[int] = []

        def record_scale(grad: torch.Tensor) -> None:
            # The gradient reaching the loss is the factor the loss was scaled by before its backward pass.
            scales.append(float(grad))

        def forward_backward() -> torch.Tensor:
            with self.context.autocast():
                loss = schedule_loss(self.model, call.optimizer, batch, cell, non_finite=call.non_finite)
            late = call.raises_after_backward and call.form != "toggle_model"
            if raising and not late:
                raise ScheduleFault(f"optimizer {call.optimizer}'s closure fails on purpose")
            loss.register_hook(record_scale)
            if call.form == "closure_plain_backward":
                loss.backward()
            else:
                wrapper.backward(loss)
            if raising:
                raise ScheduleFault(f"optimizer {call.optimizer}'s closure fails on purpose, after its backward")
            return loss

        def closure() -> torch.Tensor:
            runs.append(1)
            _assert_closure_autocast(cell, call)
            return forward_backward()

        if call.form == "toggle_model":
            with wrapper.toggle_model():
                forward_backward()
            wrapper.step(make_optimizer_step=call.make_optimizer_step)
        else:
            wrapper.step(closure, make_optimizer_step=call.make_optimizer_step)
            assert len(runs) == 1, f"{call}: the closure ran {len(runs)} times in one step() call, not once [CLOS-001]"

    def _raising_attempt(self, call: Call, batch: Batch, cell: Cell, held: int) -> None:
        """The attempt raises; flags and parameters are as before, and the windows as the failure policy leaves them.

        Raised before the backward (or in a ``toggle_model`` block, outside any ``step()``), or under ``"restore"``:
        every gradient exactly as before [CLOS-003, FAIL-002, FAIL-004]. Raised after the backward under
        ``"discard"``: the calling optimizer's gradients ``None``, its ``last_outcome`` ``DISCARDED`` and a note on the
        exception; every other optimizer's gradients and outcome as before [FAIL-003, FAIL-002].
        """
        params = list(self.model.parameters())
        wrapper = self.wrappers[call.optimizer]
        own = {id(param) for group in wrapper.param_groups for param in group["params"]}
        discards = call.fails_after_backward and self.on_failure == "discard"
        flags = [param.requires_grad for param in params]
        values = [param.detach().clone() for param in params]
        grads = [None if param.grad is None else param.grad.detach().clone() for param in params]
        outcomes = [other.last_outcome for other in self.wrappers]
        where = "toggle_model block" if call.form == "toggle_model" else "closure"
        if call.fails_after_backward:
            where += " after its backward"
        with refuses(
            ScheduleFault,
            f"{call}, whose {where} raises ScheduleFault",
            f"CLOS-003: the exception raised in a step()'s {where} propagates",
        ) as raised:
            self._attempt(call, batch, cell, [], raising=True)
        what = f"after {call} raised in its {where} (on_failure={self.on_failure!r})"
        assert [param.requires_grad for param in params] == flags, f"{what}: requires_grad flags were not restored"
        for i, (param, value, grad) in enumerate(zip(params, values, grads, strict=True)):
            unchanged = identical(param.detach(), value)
            assert unchanged, f"{what}: parameter {i} changed"
            if discards and id(param) in own:
                assert param.grad is None, f"{what}: the gradient of parameter {i} survived the discarded window"
            elif grad is None:
                assert param.grad is None, f"{what}: parameter {i} has a gradient it did not have before"
            else:
                unchanged = param.grad is not None and identical(param.grad, grad)
                assert unchanged, f"{what}: the gradient of parameter {i} changed"
        for index, other in enumerate(self.wrappers):
            want = StepOutcome.DISCARDED if discards and index == call.optimizer else outcomes[index]
            assert other.last_outcome is want, (
                f"{what}: optimizer {index}'s last_outcome is {outcome_names([other.last_outcome])[0]}, expected "
                f"{outcome_names([want])[0]}"
            )
        if discards:
            assert_discard_note(raised.value, wrapper.optimizer, (held, held + 1), what)


def _assert_closure_autocast(cell: Cell, call: Call) -> None:
    """Inside the closure, before it enters ``context.autocast()`` itself, the context's autocast is on [CLOS-001]."""
    device_type = cell_device(cell).type
    enabled = torch.is_autocast_enabled(device_type)
    want = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(cell.precision)
    if want is None:
        assert not enabled, f"{call}: autocast is on inside the closure in {cell.precision} [CLOS-001]"
        return
    dtype = torch.get_autocast_dtype(device_type)
    assert enabled and dtype == want, (
        f"{call}: the closure must run inside the context's autocast region ({want}); inside it autocast is "
        f"{'on with ' + str(dtype) if enabled else 'off'} [CLOS-001]"
    )


def _where(position: IterationPosition) -> str:
    if position.batch_idx is None:
        return f"iteration {position.index} (epoch {position.epoch}, outside any batch)"
    last = ", the epoch's last" if position.is_last else ""
    return f"iteration {position.index} (epoch {position.epoch}, batch {position.batch_idx}{last})"


def _scale_factor(got: list[float], want: list[float]) -> float:
    """The constant ratio of the implementation's loss scales to the oracle's (1.0 before any scaled backward)."""
    return got[0] / want[0] if got and want else 1.0


def _assert_scales(got: list[float], want: list[float], scaled: bool, exact: bool, what: str) -> None:
    """The loss scale of each backward pass: 1 without a scaler; with one, the oracle's up to a constant factor.

    With settings given to the factory (``exact``) the scales are the oracle's themselves.
    """
    assert len(got) == len(want), f"{what}: {len(got)} backward passes were seen, the schedule makes {len(want)}"
    if not got:
        return
    if not scaled:
        assert all(scale == 1.0 for scale in got), f"{what}: losses were scaled by {got} without a loss scaler"
        return
    factor = 1.0 if exact else _scale_factor(got, want)
    relative = [scale / factor for scale in got]
    assert relative == want, (
        f"{what}: the loss scales of the backward passes were {got}; the scaler "
        + ("built with the settings given to the factory, " if exact else "")
        + f"updated once per iteration after every optimizer that stepped gives {[scale * factor for scale in want]}"
    )


def _assert_grads(subject: _Subject, oracle: ScheduleOracle, cell: Cell, factor: float, what: str) -> None:
    """Every parameter's gradient is the oracle's: ``None`` where its is, the open windows' (scaled) sums elsewhere.

    Gradients are compared relative to their own size (the parameter tolerances assume values of order one), in
    the tolerance of reordered arithmetic: parameters that agree to rounding give gradients that agree to a bit more.
    """
    tol = REORDERED_TOLERANCES[cell.precision]
    named = zip(subject.model.named_parameters(), oracle.model.named_parameters(), strict=True)
    for (name, got), (_, want) in named:
        if want.grad is None:
            assert got.grad is None, f"{what}: {name} has a gradient; the oracle's is None (its window is closed)"
            continue
        assert got.grad is not None, f"{what}: {name} has no gradient; the oracle's open window holds one"
        mine, theirs = got.grad.detach().double().cpu() / factor, want.grad.detach().double().cpu()
        size = float(theirs[theirs.isfinite()].abs().max()) if bool(theirs.isfinite().any()) else 0.0
        close = torch.allclose(mine, theirs, rtol=tol.rtol, atol=tol.atol * max(size, 1e-30), equal_nan=True)
        if not close:
            diff = float((mine - theirs).abs().nan_to_num(posinf=float("inf")).max())
            raise AssertionError(
                f"{what}: the gradient of {name} differs from the oracle's (max abs diff {diff:.3g} on gradients of "
                f"size {size:.3g}): an open window's gradients must be the sum of its micro-batches' gradients"
                + (f", at the current loss scale (x{factor:g} the oracle's)" if factor != 1.0 else "")
            )


def _assert_outcomes(subject: _Subject, oracle: ScheduleOracle, what: str) -> None:
    """Every wrapper's ``last_outcome`` is its own last call's, whichever wrapper was called last [STEP-004]."""
    got = [wrapper.last_outcome for wrapper in subject.wrappers]
    for index, known in enumerate(subject.known_outcomes):
        if known:
            assert got[index] is oracle.last_outcomes[index], (
                f"{what}: optimizer {index}'s last_outcome reads {outcome_names([got[index]])[0]}, but its own last "
                f"call gave {outcome_names([oracle.last_outcomes[index]])[0]} "
                f"(last_outcomes of all: {outcome_names(got)})"
            )


def _assert_final_state(
    optimizer_states: list[dict[str, Any]],
    scaler_states: list[dict[str, Any]],
    oracle: ScheduleOracle,
    cell: Cell,
    scales: list[float],
) -> None:
    """The inner optimizers' state (Adam's step counts included) and the loss scaler's state are the oracle's.

    ``optimizer_states``: each inner optimizer's ``state_dict()``; ``scaler_states``: the ``GradScaler`` states
    found in the context's state (:func:`.assertions.grad_scaler_states`).
    """
    tol = tolerance_for(cell)
    for index, (got_dict, optimizer) in enumerate(zip(optimizer_states, oracle.optimizers, strict=True)):
        want_dict = optimizer.state_dict()
        groups = zip(got_dict["param_groups"], want_dict["param_groups"], strict=True)
        for group, (mine_group, their_group) in enumerate(groups):
            differ = {key: mine_group.get(key) for key, value in their_group.items() if mine_group.get(key) != value}
            assert not differ, (
                f"optimizer {index}, parameter group {group}: {differ}, the oracle's group is {their_group}"
            )
        got, want = got_dict["state"], want_dict["state"]
        # A fused optimizer under a plain GradScaler creates step-0 state on a skipped step; an implementation that
        # never calls the inner step on a skip leaves none, as AMP-004 allows: such entries may be missing.
        untouched = {param for param, entry in want.items() if "step" in entry and float(entry["step"]) == 0}
        assert set(got) <= set(want) and set(want) - set(got) <= untouched, (
            f"optimizer {index}: state for parameters {sorted(got)}, expected {sorted(want)}"
        )
        for param, entry in want.items():
            if param not in got:
                continue
            keys = sorted(got[param])
            assert keys == sorted(entry), (
                f"optimizer {index}, parameter {param}: state keys {keys}, not {sorted(entry)}"
            )
            for key, value in entry.items():
                mine = got[param][key]
                where = f"optimizer {index} ({type(optimizer).__name__}), parameter {param}, state {key!r}"
                if key == "step":
                    assert float(mine) == float(value), f"{where}: {float(mine)} real steps, expected {float(value)}"
                elif isinstance(value, torch.Tensor):
                    assert torch.allclose(mine.double().cpu(), value.double().cpu(), rtol=tol.rtol, atol=tol.atol), (
                        f"{where} differs from the oracle's"
                    )
    if oracle.scaler is None:
        return
    found = scaler_states
    if len(found) == 1:  # the context keeps a GradScaler's own state dict: its growth tracker is observable
        want_state = oracle.scaler.state_dict()
        assert found[0]["_growth_tracker"] == want_state["_growth_tracker"], (
            f"the loss scaler's growth tracker is {found[0]['_growth_tracker']}, expected "
            f"{want_state['_growth_tracker']} (one update per iteration in which an optimizer stepped)"
        )
        if scales:
            factor = _scale_factor(scales, oracle.scales)
            assert found[0]["scale"] == want_state["scale"] * factor, (
                f"the loss scaler's final scale is {found[0]['scale']}, expected {want_state['scale'] * factor} "
                f"(the oracle's, times the ratio {factor} of the first loss scales)"
            )


@dataclass
class _Snapshot:
    """An original's whole observable state when a copy of it was taken: it must not change afterwards."""

    subject: _Subject
    taken: str
    model: Snapshot
    state: object

    @classmethod
    def of(cls, subject: _Subject, taken: str) -> _Snapshot:
        return cls(subject, taken, snapshot(subject.model), cloned(subject.context.state_dict()))

    def assert_unchanged(self) -> None:
        """The original's parameters, gradients and context state are as they were [PICKLE-001]."""
        what = f"the original of the copy taken {self.taken}, after the copy trained on"
        assert_unchanged(self.subject.model, self.model, what)
        problem = state_diff(cloned(self.subject.context.state_dict()), self.state, "context.state_dict()")
        assert problem is None, f"{what}: {problem}"


def _run_schedule(
    make_context: MakeContext, cell: Cell, schedule: Schedule, on_failure: FailurePolicy = "discard"
) -> list[list[torch.Tensor]]:
    """Run ``schedule`` on the implementation and the oracle side by side; return the parameters per iteration."""
    oracle = ScheduleOracle(schedule, cell, on_failure)
    subject = _Subject.build(make_context, schedule, cell, on_failure)
    batches = schedule_batches(schedule)
    scales: list[float] = []
    steps = [0] * len(schedule.heads)
    trajectory = []
    structure: list[Event] = []
    originals: list[_Snapshot] = []
    exact = schedule.grad_scaler is not None and oracle.scaler is not None
    for position in schedule.iterations():
        where = _where(position)
        oracle.begin(position)
        for event in position.events:
            if event.kind in ("pickle", "deepcopy"):
                originals.append(_Snapshot.of(subject, f"by {event.kind} before {where}"))
                subject = subject.copied(event.kind)
            else:
                subject.apply(event, schedule)
                structure.append(event)
        if position.batch_idx is None:
            block: AbstractContextManager[None] = nullcontext()
        else:
            block = subject.context.batch(position.batch_idx, is_last=position.is_last)
        with block:
            for call in position.calls:
                held = oracle.pending[call.optimizer]
                expected = oracle.call(position, call)
                outcome = subject.call(call, batches[position.index], cell, scales, held)
                what = f"{where}, {call} (accumulate_grad_batches={schedule.accumulate_grad_batches})"
                assert outcome is expected, f"{what}: outcome {outcome_names([outcome])[0]}, expected {expected.value}"
                steps[call.optimizer] += outcome is StepOutcome.STEPPED
                if outcome in REAL_STEP:
                    own = [p for g in subject.wrappers[call.optimizer].param_groups for p in g["params"]]
                    assert all(param.grad is None for param in own), (
                        f"{what}: optimizer {call.optimizer}'s gradients survived its real step"
                    )
                _assert_outcomes(subject, oracle, what)
                _assert_grads(subject, oracle, cell, 1.0 if exact else _scale_factor(scales, oracle.scales), what)
        oracle.end(position)
        what = f"{where}, calls {list(position.calls)}"
        assert_params_close(subject.model, oracle.model, cell, what)
        _assert_scales(scales, oracle.scales, oracle.scaler is not None, exact, where)
        _assert_grads(subject, oracle, cell, 1.0 if exact else _scale_factor(scales, oracle.scales), f"end of {what}")
        _assert_outcomes(subject, oracle, f"end of {what}")
        trajectory.append([param.detach().cpu().clone() for param in subject.model.parameters()])
        if position.index in schedule.resume_after:
            subject = subject.resumed(make_context, schedule, cell, structure)
    assert steps == oracle.steps, f"real steps taken per optimizer: {steps}; skipped ones do not count: {oracle.steps}"
    optimizer_states = [wrapper.optimizer.state_dict() for wrapper in subject.wrappers]
    _assert_final_state(optimizer_states, grad_scaler_states(subject.context.state_dict()), oracle, cell, scales)
    for original in originals:
        original.assert_unchanged()
    return trajectory


# -- schedules -----------------------------------------------------------------------------------------------


def _draw_schedule(
    draw: DrawFn, cell: Cell, *, faults: bool, resumes: bool, copies: bool, ranks: bool = False
) -> Schedule:
    """A random schedule along every dimension of ``GENERATED``, plus raising attempts and checkpoints when asked.

    With ``ranks`` (a cell of several ranks) the model keeps its shape: no parameter the forward pass never uses and
    no event between iterations (DDP's reducer and FSDP's shards are built for the parameters at preparation).
    """
    sixteen_mixed = cell.precision == "16-mixed"
    count = draw(st.integers(1, 3))
    heads = tuple(
        HeadSpec(
            kind=draw(st.sampled_from(OPTIMIZER_KINDS)),
            groups=draw(st.integers(1, 2)),
            unused=not ranks and draw(st.integers(0, 3)) == 0,
            frozen=frozenset(draw(st.sets(st.sampled_from(FREEZABLE), max_size=1))),
        )
        for _ in range(count)
    )
    accumulate = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 7), min_size=1, max_size=2))
    # 16-mixed: a plain loss.backward() would skip the loss scaling that the wrapper owes [ACC-002].
    forms = tuple(form for form in CALL_FORMS if not (sixteen_mixed and form == "closure_plain_backward"))
    added: set[int] = set()
    epochs = []
    for length in lengths:
        iterations = []
        for _ in range(length):
            events = []
            if not ranks and draw(st.integers(0, 4)) == 0:
                kinds: list[EventKind] = [
                    "freeze",
                    "unfreeze",
                    "add_group",
                    *(("pickle", "deepcopy") if copies else ()),
                ]
                kind = draw(st.sampled_from(kinds))
                head = draw(st.integers(0, count - 1))
                if kind == "add_group" and head in added:
                    kind = "unfreeze"
                added |= {head} if kind == "add_group" else set()
                events.append(Event(kind, head, draw(st.sampled_from(FREEZABLE))))
            order = draw(st.permutations(range(count)))
            calls = tuple(
                Call(
                    optimizer,
                    make_optimizer_step=draw(st.sampled_from((None, True, False, None))),
                    form=draw(st.sampled_from(forms)),
                    zero_grad_first=draw(st.booleans()),
                    set_to_none=draw(st.booleans()),
                    non_finite=sixteen_mixed and draw(st.integers(0, 7)) == 0,
                    raises_first=faults and draw(st.integers(0, 3)) == 0,
                    raises_after_backward=faults and draw(st.booleans()),
                )
                for optimizer in order
                if draw(st.integers(0, 3)) > 0
            )
            in_batch = draw(st.integers(0, 5)) > 0
            iterations.append(Iteration(calls, tuple(events), in_batch))
        epochs.append(tuple(iterations))
    last = max(sum(lengths) - 2, 0)
    resume_after = frozenset(draw(st.sets(st.integers(0, last), min_size=1, max_size=2))) if resumes else frozenset()
    clipping = draw(st.sampled_from((None, None, *CLIPPINGS)))
    grad_scaler = None
    if sixteen_mixed and draw(st.booleans()):
        grad_scaler = GradScalerSettings(
            init_scale=2.0 ** draw(st.sampled_from((10, 13, 16))), growth_interval=draw(st.integers(1, 3))
        )
    return Schedule(heads, accumulate, tuple(epochs), resume_after, clipping, grad_scaler)


def _explicit_schedule(cell: Cell, *, faults: bool, resumes: bool) -> Schedule:
    """Three optimizers and ``accumulate_grad_batches=3`` over epochs of 5 and 4 batches, by hand.

    Every rule shows: windows cut short, flushed, and kept open by ``False`` (optimizer 2's across the epoch's
    end); every call form; ``zero_grad()`` on open windows; under 16-mixed an overflow of optimizer 2 while the
    windows of 0 and 1 stay open (the scale backs off, those windows are rescaled, Adam counts no step); with
    ``faults`` raising closures on an accumulating call, on calls that close a window of three and of one micro-step
    and in a ``toggle_model`` block; with ``resumes`` checkpoints after iterations 1 and 5, where windows are open.
    """
    overflow = cell.precision == "16-mixed"
    plain: CallForm = "closure" if overflow else "closure_plain_backward"
    epochs = (
        (
            (Call(0), Call(1, form="toggle_model", zero_grad_first=True), Call(2, True, non_finite=overflow)),
            (Call(1, False), Call(0, zero_grad_first=True, raises_first=faults)),
            (
                Call(0, raises_first=faults, raises_after_backward=True),
                Call(2, form="toggle_model", raises_first=faults),
                Call(1, form=plain),
            ),
            (Call(2, False), Call(0, True, zero_grad_first=True)),
            (Call(0, form="toggle_model"), Call(1, raises_first=faults), Call(2, False)),
        ),
        (
            (Call(0, False), Call(1), Call(2, form=plain)),
            (Call(1, form="toggle_model", zero_grad_first=True), Call(0)),
            (Call(2), Call(0), Call(1, False)),
            (Call(1), Call(0, raises_first=faults)),
        ),
    )
    heads = (HeadSpec("sgd_momentum"), HeadSpec("sgd_momentum"), HeadSpec("adam"))
    return Schedule(
        heads,
        3,
        tuple(tuple(Iteration(calls) for calls in epoch) for epoch in epochs),
        frozenset({1, 5}) if resumes else frozenset(),
    )


def _explicit_structure_schedule(cell: Cell, *, faults: bool, resumes: bool, copies: bool) -> Schedule:
    """Two optimizers over heads that change shape as the loop runs, by hand.

    Fused Adam with two parameter groups and a parameter it never gets a gradient for (first in its first group),
    SGD with momentum (foreach) with one frozen parameter; clipping by norm over windows of two; a group added to
    each optimizer after wrap, one while the other's window is open; a parameter frozen, then unfrozen, after wrap;
    ``zero_grad(set_to_none=False)``; a window finished outside any batch (under 16-mixed the scaler updates
    right after each real step there); under 16-mixed a loss scale that grows every iteration and backs off after
    an overflow, across open windows; with ``copies`` a pickle and a deepcopy of the whole training state that go on
    training (overflowing and growing) while the originals must stay as they were.
    """
    overflow = cell.precision == "16-mixed"
    copy_events: tuple[Event, ...] = (Event("pickle"),) if copies else ()
    deepcopy_events: tuple[Event, ...] = (Event("deepcopy"),) if copies else ()
    first = (
        Iteration((Call(0), Call(1, zero_grad_first=True, set_to_none=False))),
        Iteration((Call(1, False), Call(0, raises_first=faults, raises_after_backward=True)), (Event("add_group", 1),)),
        Iteration((Call(0, form="toggle_model"), Call(1, non_finite=overflow)), (Event("freeze", 0, 2), *copy_events)),
        Iteration((Call(1, form="toggle_model", zero_grad_first=True), Call(0, True)), (Event("add_group", 0),)),
        Iteration((Call(0), Call(1)), (Event("unfreeze", 0, 2), *deepcopy_events)),
    )
    loose = (Iteration((Call(0), Call(1, False)), in_batch=False), Iteration((Call(1),), in_batch=False))
    second = (
        Iteration((Call(1, raises_first=faults), Call(0, zero_grad_first=True, set_to_none=False))),
        Iteration((Call(0, non_finite=overflow), Call(1, True))),
        Iteration((Call(0), Call(1))),
    )
    heads = (
        HeadSpec("adam_fused", groups=2, unused=True),
        HeadSpec("sgd_foreach", frozen=frozenset({1})),
    )
    return Schedule(
        heads,
        2,
        (first + loose, second),
        frozenset({2, 5}) if resumes else frozenset(),
        ("norm", 1.5e-3),
        GradScalerSettings(init_scale=2.0**12, growth_interval=1) if overflow else None,
    )


def _check_schedules(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cell: Cell,
    budget: str,
    check: Callable[[Schedule], None],
    *,
    faults: bool = False,
    resumes: bool = False,
    copies: bool = False,
    ranks: bool = False,
) -> None:
    """Run ``check`` on the explicit schedules, then on generated ones (derandomised, no example database)."""
    if HYPOTHESIS_MISSING is not None:
        unavailable(HYPOTHESIS_MISSING)
    requested = request.config.getoption("property_examples", default=None)
    with _quiet_process_state(tmp_path_factory.getbasetemp() / "hypothesis"):
        schedules_of(cell, budget, requested, faults=faults, resumes=resumes, copies=copies, ranks=ranks, run=check)


def schedules_of(
    cell: Cell,
    budget: str,
    requested: int | None,
    *,
    faults: bool,
    resumes: bool,
    copies: bool,
    ranks: bool = False,
    run: Callable[[Schedule], None] | None = None,
) -> list[Schedule]:
    """The schedules a property check runs in ``cell`` (its explicit ones first), running ``run`` on each.

    Without ``run`` it only draws them: the same schedules, as the derandomised generator draws them in the same
    order whatever the check does with them (as long as none fails). With ``ranks``, the schedules of a cell of
    several ranks (:func:`_draw_schedule`): the explicit one whose model changes shape is left out.
    """
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if requested else ())
    strategy: SearchStrategy[Schedule] = st.composite(_draw_schedule)(
        cell, faults=faults, resumes=resumes, copies=copies, ranks=ranks
    )
    seen: list[Schedule] = []

    def generated(schedule: Schedule) -> None:
        seen.append(schedule)
        if run is not None:
            run(schedule)

    explicit = [_explicit_schedule(cell, faults=faults, resumes=resumes)]
    if not ranks:
        explicit.append(_explicit_structure_schedule(cell, faults=faults, resumes=resumes, copies=copies))
    test = given(schedule=strategy)(generated)
    for schedule in reversed(explicit):
        test = example(schedule=schedule)(test)
    settings(
        max_examples=int(requested) if requested else CI_EXAMPLES[budget],
        derandomize=True,
        database=None,
        deadline=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(test)()
    return seen


@contextmanager
def _quiet_process_state(storage: Path) -> Iterator[None]:
    """One CPU thread (tiny tensors: threads only wait on each other), Hypothesis's files under ``storage``.

    Hypothesis caches what it reads from local source files in its storage directory (``.hypothesis`` in the
    current folder by default); the suite writes nowhere but pytest's temporary folder.
    """
    threads = torch.get_num_threads()
    home = vars(hypothesis.configuration).get("__hypothesis_home_directory")
    torch.set_num_threads(1)
    hypothesis.configuration.set_hypothesis_home_dir(storage)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        hypothesis.configuration.set_hypothesis_home_dir(home)


# -- the checks ----------------------------------------------------------------------------------------------


@pytest.mark.requirement(
    "STEP-001",
    "STEP-002",
    "STEP-003",
    "STEP-004",
    "ACC-001",
    "ACC-002",
    "ACC-003",
    "ZERO-001",
    "ZERO-002",
    "CLOS-001",
    "TOGGLE-001",
    "TOGGLE-002",
    "PROXY-003",
    "CLIP-001",
    "AMP-002",
    "AMP-003",
    "AMP-004",
    "AMP-006",
    "PICKLE-001",
)
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(**GENERATED)
def test_generated_schedules_match_the_oracle(
    make_context: MakeContext,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Generated schedules: outcomes and gradients after every call, parameters and scales after every iteration."""

    def check(schedule: Schedule) -> None:
        _run_schedule(make_context, cell, schedule)

    copies = "pickling" in implementation.features
    _check_schedules(request, tmp_path_factory, cell, "oracle", check, copies=copies)


@pytest.mark.requirement("CLOS-003", "TOGGLE-002", "FAIL-002", "FAIL-003", "FAIL-004", "STEP-004")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(**FAULTS_GENERATED)
def test_generated_schedules_with_raising_closures(
    make_context: MakeContext,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    on_failure: FailurePolicy,
) -> None:
    """A call whose closure (or ``toggle_model`` block) raises; the schedule then goes on with its retry.

    Raised before its backward, the call changes nothing under either policy. Raised after it, nothing under
    ``"restore"``; under ``"discard"`` the oracle discards that optimizer's window (``DISCARDED`` until the retry,
    which starts a new window) and every other window is untouched.
    """

    def check(schedule: Schedule) -> None:
        _run_schedule(make_context, cell, schedule, on_failure)

    copies = "pickling" in implementation.features
    _check_schedules(request, tmp_path_factory, cell, "faults", check, faults=True, copies=copies)


@pytest.mark.requirement("CKPT-001", "CKPT-002", "PROXY-003")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(**RESUME_GENERATED)
def test_generated_schedules_resume_from_checkpoints(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Checkpoints resumed between iterations in fresh objects: the oracle's trajectory, bit for bit the same."""

    def check(schedule: Schedule) -> None:
        resumed = _run_schedule(make_context, cell, schedule)
        uninterrupted = _run_schedule(make_context, cell, dataclasses.replace(schedule, resume_after=frozenset()))
        for index, (got, want) in enumerate(zip(resumed, uninterrupted, strict=True)):
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                same = identical(a, b)
                assert same, (
                    f"iteration {index}: parameter {i} after resuming at iterations {sorted(schedule.resume_after)} "
                    f"differs from the uninterrupted run by {(a.double() - b.double()).abs().max().item():.3g}"
                )

    _check_schedules(request, tmp_path_factory, cell, "resume", check, resumes=True)


# -- world size 2: the same schedules on the ranks of a DDP or FSDP cell ------------------------------------------

RANK_GENERATED = {
    **{dimension: values for dimension, values in GENERATED.items() if dimension != "copies"},
    "parameters": ("frozen", "no gradient in a window"),
    "param_groups": ("1", "2 with other hyper-parameters"),
}
"""What the generator draws for a cell of several ranks: every dimension of ``GENERATED`` but those that change the
model's shape after preparation (events between iterations, parameters never used) and copies."""


@dataclass
class _RankExpectation:
    """What the oracle on the global batch makes of one call: its outcome, every wrapper's, every gradient."""

    outcome: StepOutcome
    last_outcomes: list[StepOutcome | None]
    grads: list[torch.Tensor | None]


def _oracle_on_ranks(schedule: Schedule, cell: Cell) -> tuple[ScheduleOracle, list[list[_RankExpectation]], list[Any]]:
    """The schedule's oracle on the global batch: each call's expectation, and the parameters after each iteration."""
    oracle = ScheduleOracle(schedule, cell)
    calls: list[list[_RankExpectation]] = []
    params = []
    for position in schedule.iterations():
        oracle.begin(position)
        calls.append([])
        for call in position.calls:
            outcome = oracle.call(position, call)
            calls[-1].append(
                _RankExpectation(outcome, list(oracle.last_outcomes), grads(oracle.model.parameters(), to_cpu=True))
            )
        oracle.end(position)
        params.append(param_values(oracle.model.parameters(), to_cpu=True))
    return oracle, calls, params


def _assert_rank_grads(
    got: list[list[Any]], want: list[torch.Tensor | None], cell: Cell, factor: float, what: str
) -> None:
    """The mean over the ranks of their own gradients is the global batch's (its open windows' sums).

    Under FSDP a shard holds no open window (what micro-steps without sync accumulate lives elsewhere): only a
    closed window, where the oracle has no gradient, is checked there.
    """
    tol = REORDERED_TOLERANCES[cell.precision]
    for i, theirs in enumerate(want):
        mine = [rank[i] for rank in got]
        if theirs is None:
            assert all(grad is None for grad in mine), (
                f"{what}: parameter {i} has a gradient on rank(s) {[r for r, g in enumerate(mine) if g is not None]}; "
                "the oracle's window is closed (gradients are cleared after a real step) [ZERO-001]"
            )
            continue
        if cell.strategy == "fsdp":
            continue
        assert all(grad is not None for grad in mine), (
            f"{what}: parameter {i} has no gradient on rank(s) {[r for r, g in enumerate(mine) if g is None]}; the "
            "oracle's open window holds one"
        )
        mean = torch.stack([grad.double() for grad in mine]).mean(dim=0) / factor
        size = float(theirs[theirs.isfinite()].abs().max()) if bool(theirs.isfinite().any()) else 0.0
        # Relative to the largest gradient: a half batch's gradients round in the autocast dtype on their own.
        atol = max(tol.atol, tol.rtol) * max(size, 1e-30)
        close = torch.allclose(mean, theirs.double(), rtol=tol.rtol, atol=atol, equal_nan=True)
        assert close, (
            f"{what}: the mean over the ranks of parameter {i}'s gradients differs from the global batch's open "
            f"window (max abs diff {float((mean - theirs.double()).abs().nan_to_num().max()):.3g} on gradients of "
            f"size {size:.3g}): each rank's window holds its own shard's sums, unsynced [DDP-001, FSDP-002]"
        )


def _run_schedule_on_ranks(ranks: RankPool, cell: Cell, schedule: Schedule) -> None:
    """Run ``schedule`` on every rank of the cell against the oracle on the global batch.

    After every call: every wrapper's ``last_outcome`` on every rank; process-group reductions in a call that closes
    a window and none in one that does not; the ranks' gradients. After every iteration: the parameters identical on
    every rank and the oracle's; the loss scales. At the end: the optimizers' and the loss scaler's state.
    """
    oracle, expected, params = _oracle_on_ranks(schedule, cell)
    closes = [[want.outcome in REAL_STEP for want in iteration] for iteration in expected]
    scenario = "lightning_optimizer.conformance.rank_schedules:run_schedule"
    results = ranks.run(scenario, cell, schedule=schedule, closes=closes)
    sync_rule = "[FSDP-002]" if cell.strategy == "fsdp" else "[DDP-001]"
    scales = results[0]["scales"]
    exact = schedule.grad_scaler is not None and oracle.scaler is not None
    factor = 1.0 if exact else _scale_factor(scales, oracle.scales)
    for position, wants in zip(schedule.iterations(), expected, strict=True):
        where = f"{_where(position)} (accumulate_grad_batches={schedule.accumulate_grad_batches})"
        for j, (call, want) in enumerate(zip(position.calls, wants, strict=True)):
            what = f"{where}, {call}"
            for rank, result in enumerate(results):
                got = result["calls"][position.index][j]
                assert got["outcomes"] == want.last_outcomes, (
                    f"{what}, rank {rank}: last_outcome of every wrapper {outcome_names(got['outcomes'])}, expected "
                    f"{outcome_names(want.last_outcomes)} (this call: {want.outcome.value}) [STEP-004]"
                )
                if closes[position.index][j]:
                    assert got["reductions"] > 0, (
                        f"{what}, rank {rank}: the call closes its window, yet it issued no reducing operation of the "
                        f"process group: the window's gradients were never synced {sync_rule}"
                    )
                else:
                    assert got["reductions"] == 0, (
                        f"{what}, rank {rank}: the call does not close its window, yet it issued "
                        f"{got['reductions']} reducing operation(s) of the process group: micro-steps that do not "
                        f"close a window run without gradient sync {sync_rule}"
                    )
            rank_grads = [result["calls"][position.index][j]["grads"] for result in results]
            _assert_rank_grads(rank_grads, want.grads, cell, factor, what)
        first, *others = [result["params"][position.index] for result in results]
        for rank, other in enumerate(others, start=1):
            assert_same_values(other, first, f"{where}: rank {rank}'s parameters against rank 0's [DDP-002, FSDP-003]")
        tol = REORDERED_TOLERANCES[cell.precision]
        for i, (got_param, want_param) in enumerate(zip(first, params[position.index], strict=True)):
            close = torch.allclose(got_param.double(), want_param.double(), rtol=tol.rtol, atol=tol.atol)
            assert close, (
                f"{where}: parameter {i} differs from the plain loop on the global batch by "
                f"{float((got_param.double() - want_param.double()).abs().max()):.3g} [DDP-002, FSDP-003]"
            )
    _assert_scales(scales, oracle.scales, oracle.scaler is not None, exact, "the schedule on the ranks")
    _assert_final_state(results[0]["optimizers"], results[0]["scalers"], oracle, cell, scales)


@pytest.mark.requirement(
    "DDP-001",
    "DDP-002",
    "FSDP-002",
    "FSDP-003",
    "FSDP-004",
    "STEP-001",
    "STEP-002",
    "STEP-003",
    "STEP-004",
    "ACC-001",
    "ACC-003",
    "ZERO-001",
    "ZERO-002",
    "TOGGLE-001",
    "CLIP-001",
    "AMP-002",
    "AMP-003",
    "AMP-004",
)
@pytest.mark.cells(devices=EAGER, world_sizes=(2,), strategies=("ddp", "fsdp"))
@pytest.mark.varies(**RANK_GENERATED)
def test_generated_schedules_on_ranks_match_the_global_batch(
    ranks: RankPool, cell: Cell, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Generated schedules on two ranks, each head its own prepared module: the plain loop on the global batch."""

    def check(schedule: Schedule) -> None:
        _run_schedule_on_ranks(ranks, cell, schedule)

    _check_schedules(request, tmp_path_factory, cell, "ranks", check, ranks=True)
