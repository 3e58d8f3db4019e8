"""A schedule run on an implementation, recorded, and compared with :class:`.schedule_oracle.ScheduleOracle`.

:func:`run_schedule` drives an implementation through a :class:`~.schedule_oracle.Schedule` as a user's loop
does (events, copies and checkpoints between iterations, raising first attempts, every call form) and records
plain data (:class:`Run`): after every call each wrapper's ``last_outcome`` and every gradient (the open windows'),
after every iteration also the parameters and the loss scales so far, at the end the optimizers' and the loss
scaler's state. It runs in the check's process at world size 1, or on each rank of a DDP or FSDP cell
(:mod:`.rank_schedules`: each head prepared as a module of its own, each rank on its shard of every batch).
:func:`oracle_run` records the same of the oracle; :func:`assert_matches` compares the two.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch

from lightning_optimizer.conformance.assertions import (
    Snapshot,
    assert_same_values,
    assert_unchanged,
    cloned,
    grad_scaler_states,
    grads,
    outcome_names,
    param_values,
    snapshot,
    state_diff,
)
from lightning_optimizer.conformance.collectives import Reductions, reductions
from lightning_optimizer.conformance.harness import (
    REORDERED_TOLERANCES,
    Batch,
    assert_discard_note,
    cell_device,
    failure_settings,
    refuses,
    tolerance_for,
    zeroing_settings,
)
from lightning_optimizer.conformance.schedule_oracle import (
    Call,
    Event,
    IterationPosition,
    Schedule,
    ScheduleHead,
    ScheduleModel,
    ScheduleOracle,
    apply_structure,
    late_group,
    make_optimizer,
    schedule_batches,
    schedule_loss,
)
from lightning_optimizer.spec import Cell, FailurePolicy, OptimizerWrapper, StepOutcome, TrainingContext

__all__ = ["REAL_STEP", "Planned", "Run", "ScheduleFault", "assert_matches", "oracle_run", "run_schedule"]

MakeContext = Callable[..., TrainingContext]
REAL_STEP = (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)


class ScheduleFault(RuntimeError):
    """What a generated closure raises on purpose."""


class Planned(NamedTuple):
    """What the oracle knows of a call before it runs: its window's micro-steps, and whether the call closes it."""

    held: int
    closes: bool


@dataclass
class Observed:
    """One call's or one iteration's end: ``last_outcome`` per wrapper that is pinned, gradients, parameters."""

    outcomes: dict[int, StepOutcome | None]
    grads: list[torch.Tensor | None]
    reductions: int | None = None
    params: list[torch.Tensor] = field(default_factory=list)
    scales: int = 0
    """How many backward passes the run had made by then."""
    unpinned: frozenset[int] = frozenset()
    """The oracle's: gradients (indices into ``grads``) that no rule pins now (a carrying window's) [ZERO-005]."""
    left: frozenset[int] = frozenset()
    """The oracle's: gradients that a taken real step left (unscaled, ``zero_grad_after_step=False``) [ZERO-004]."""


@dataclass
class Run:
    """A schedule's run: what :class:`Observed` after each call and iteration, then the run's final state.

    ``calls[i][j]``: after iteration ``i``'s call ``j``; ``iterations[i]``: after it; the loss scale of every
    backward pass; the final optimizer states (tensors in full) and loss scaler states.
    """

    calls: list[list[Observed]] = field(default_factory=list)
    iterations: list[Observed] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    scalers: list[dict[str, Any]] = field(default_factory=list)


def _full(tensor: torch.Tensor, local: bool = False) -> torch.Tensor:
    """``tensor`` on the CPU: a ``DTensor`` gathered from its shards (every rank calls it), or its ``local`` part."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.to_local() if local else tensor.full_tensor()
    return tensor.detach().cpu().clone()


@dataclass
class _Subject:
    """The implementation under test, set up for one schedule.

    ``known``: the wrappers whose ``last_outcome`` is pinned (all when built; after a copy or a resume, those called
    since).
    """

    context: TrainingContext
    model: ScheduleModel
    heads: list[ScheduleHead]
    wrappers: list[OptimizerWrapper[Any]]
    on_failure: FailurePolicy
    known: set[int]

    @classmethod
    def build(
        cls, make_context: MakeContext, schedule: Schedule, cell: Cell, on_failure: FailurePolicy, per_head: bool
    ) -> _Subject:
        """``per_head``: each head prepared as a module of its own (a cell of several ranks), else the model."""
        settings: dict[str, Any] = {"accumulate_grad_batches": schedule.accumulate_grad_batches}
        settings.update(failure_settings(on_failure))
        settings.update(zeroing_settings(schedule.zero_grad_after_step))
        if schedule.clipping is not None:
            settings.update(gradient_clip_algorithm=schedule.clipping[0], gradient_clip_val=schedule.clipping[1])
        if schedule.grad_scaler is not None and cell.precision == "16-mixed":
            settings.update(grad_scaler=schedule.grad_scaler)
        context = make_context(**settings)
        model = ScheduleModel(schedule.heads)
        heads = [model.head(i) for i in range(len(schedule.heads))]
        if per_head:  # DDP keeps the head as .module, fully_shard shards it in place: its parameters are the ones
            for i, head in enumerate(heads):
                model.heads[i] = context.prepare_module(head)
        else:
            prepared = context.prepare_module(model)
            assert isinstance(prepared, ScheduleModel), f"prepare_module gave a {type(prepared).__name__}"
            model, heads = prepared, [prepared.head(i) for i in range(len(schedule.heads))]
        wrappers = [
            context.wrap(make_optimizer(spec, heads[i].groups(spec), cell)) for i, spec in enumerate(schedule.heads)
        ]
        return cls(context, model, heads, wrappers, on_failure, set(range(len(wrappers))))

    def resumed(self, make_context: MakeContext, schedule: Schedule, cell: Cell, structure: list[Event]) -> _Subject:
        """Checkpoint (model, each wrapper's ``state_dict``, the context's), then load it into fresh objects.

        The fresh objects repeat the structure the loop built so far (frozen flags, added groups) before loading.
        """
        buffer = io.BytesIO()
        state = {"model": self.model.state_dict(), "optimizers": [w.state_dict() for w in self.wrappers]}
        torch.save(state | {"context": self.context.state_dict()}, buffer)
        fresh = _Subject.build(make_context, schedule, cell, self.on_failure, per_head=False)
        for event in structure:
            apply_structure(event, schedule, fresh.model, cast(list[torch.optim.Optimizer], fresh.wrappers))
        saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        fresh.model.load_state_dict(saved["model"])
        for wrapper, optimizer_state in zip(fresh.wrappers, saved["optimizers"], strict=True):
            wrapper.load_state_dict(optimizer_state)
        fresh.context.load_state_dict(saved["context"])
        fresh.known = set()
        return fresh

    def copied(self, how: str) -> _Subject:
        """A copy of the whole training state (context, model, wrappers), by pickle or deepcopy."""
        state = (self.context, self.model, self.wrappers)
        context, model, wrappers = pickle.loads(pickle.dumps(state)) if how == "pickle" else copy.deepcopy(state)
        heads = [model.head(i) for i in range(len(wrappers))]
        return _Subject(context, model, heads, wrappers, self.on_failure, set())

    def observe(self, issued: Reductions | None = None, **iteration: Any) -> Observed:
        """The pinned outcomes and this rank's gradients (a shard's own part under FSDP), and ``iteration``'s."""
        params = [param for head in self.heads for param in head.parameters()]
        outcomes = {i: self.wrappers[i].last_outcome for i in sorted(self.known)}
        local = [None if param.grad is None else _full(param.grad, local=True) for param in params]
        return Observed(outcomes, local, None if issued is None else issued.count, **iteration)

    def call(self, call: Call, batch: Batch, cell: Cell, scales: list[float], planned: Planned, ranks: bool) -> None:
        """One call of the schedule (after a first attempt that raises, when the call says so).

        Under several ``ranks`` a ``toggle_model`` block syncs only when the call closes its window.
        """
        wrapper = self.wrappers[call.optimizer]
        if call.zero_grad_first:
            wrapper.zero_grad() if call.set_to_none else wrapper.zero_grad(set_to_none=False)
        if call.raises_first:
            self._raising_attempt(call, batch, cell, planned.held)
        self._attempt(call, batch, cell, scales, sync_grad=planned.closes if ranks else None)
        self.known.add(call.optimizer)

    def _attempt(
        self, call: Call, batch: Batch, cell: Cell, scales: list[float], raising: bool = False, sync_grad: Any = None
    ) -> None:
        wrapper = self.wrappers[call.optimizer]
        runs: list[int] = []

        def forward_backward() -> torch.Tensor:
            with self.context.autocast():
                loss = schedule_loss(self.model, call.optimizer, batch, cell, non_finite=call.non_finite)
            if raising and not (call.raises_after_backward and call.form != "toggle_model"):
                raise ScheduleFault(f"optimizer {call.optimizer}'s closure fails on purpose")
            # The gradient reaching the loss is the factor the loss was scaled by before its backward pass.
            loss.register_hook(lambda grad: scales.append(float(grad)))
            loss.backward() if call.form == "closure_plain_backward" else wrapper.backward(loss)
            if raising:
                raise ScheduleFault(f"optimizer {call.optimizer}'s closure fails on purpose, after its backward")
            return loss

        def closure() -> torch.Tensor:
            runs.append(1)
            _assert_closure_autocast(cell, call)
            return forward_backward()

        if call.form == "toggle_model":
            with wrapper.toggle_model(**({} if sync_grad is None else {"sync_grad": sync_grad})):
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
        exception (``held``: the micro-steps its window held); every other optimizer's as before [FAIL-003, FAIL-002].
        """
        params = list(self.model.parameters())
        wrapper = self.wrappers[call.optimizer]
        own = {id(param) for group in wrapper.param_groups for param in group["params"]}
        discards = call.fails_after_backward and self.on_failure == "discard"
        before = snapshot(params)
        outcomes = [other.last_outcome for other in self.wrappers]
        where = ("toggle_model block" if call.form == "toggle_model" else "closure") + (
            " after its backward" if call.fails_after_backward else ""
        )
        why = f"CLOS-003: the exception raised in a step()'s {where} propagates"
        with refuses(ScheduleFault, f"{call}, whose {where} raises ScheduleFault", why) as raised:
            self._attempt(call, batch, cell, [], raising=True)
        what = f"after {call} raised in its {where} (on_failure={self.on_failure!r})"
        kept = [None if discards and id(p) in own else grad for p, grad in zip(params, before.grads, strict=True)]
        assert_unchanged(params, Snapshot(before.values, kept, before.flags), what)
        if discards:
            outcomes[call.optimizer] = StepOutcome.DISCARDED
            assert_discard_note(raised.value, wrapper.optimizer, (held, held + 1), what)
        now = [other.last_outcome for other in self.wrappers]
        assert now == outcomes, (
            f"{what}: last_outcome of every wrapper {outcome_names(now)}, not {outcome_names(outcomes)}"
        )


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


def _add_group(event: Event, schedule: Schedule, subject: _Subject, where: str) -> bool:
    """``add_group`` on the wrapper: added (``True``), or refused because its window is open [WIN-001].

    The oracle adds the group between windows and skips it with one open, so a wrapper that refuses or accepts it
    otherwise ends with other parameters than the oracle's, which the comparison finds.
    """
    head = subject.model.head(event.head)
    param = head.new_late()
    refused: str | None = None
    try:
        subject.wrappers[event.head].add_param_group(late_group(schedule.heads[event.head], param))
    except RuntimeError as error:
        refused = str(error)
    if refused is not None:
        assert "discard" in refused, (
            f"add_param_group on wrapper {event.head} before {where} raised {refused!r}, which does not say to drop "
            "the window with discard(wrapper) (WIN-001)"
        )
        return False
    head.late.append(param)
    return True


def run_schedule(
    make_context: MakeContext,
    schedule: Schedule,
    cell: Cell,
    plan: list[list[Planned]],
    on_failure: FailurePolicy = "discard",
    rank: tuple[int, int] | None = None,
) -> Run:
    """Run ``schedule`` on the implementation; ``plan[i][j]``: :class:`Planned` of iteration ``i``'s call ``j``.

    ``rank``: ``(rank, world_size)`` in a cell of several ranks: each head prepared on its own, the rank's equal
    part of each batch, the reductions of each call counted, the parameters and optimizer states gathered in full.
    Copies taken between iterations are checked unchanged at the end [PICKLE-001].
    """
    subject = _Subject.build(make_context, schedule, cell, on_failure, per_head=rank is not None)
    batches = schedule_batches(schedule)
    if rank is not None:  # the mean of the ranks' losses is the global batch's loss
        batches = [(x.chunk(rank[1])[rank[0]], y.chunk(rank[1])[rank[0]]) for x, y in batches]
    run, structure, originals = Run(), list[Event](), list[tuple[str, _Subject, Snapshot, object]]()
    for position, planned in zip(schedule.iterations(), plan, strict=True):
        for event in position.events:
            if event.kind in ("pickle", "deepcopy"):
                state = cloned(subject.context.state_dict())
                originals.append(
                    (f"by {event.kind} before {_where(position)}", subject, snapshot(subject.model), state)
                )
                subject = subject.copied(event.kind)
            elif event.kind == "add_group":
                if _add_group(event, schedule, subject, _where(position)):
                    structure.append(event)
            else:
                apply_structure(event, schedule, subject.model, cast(list[torch.optim.Optimizer], subject.wrappers))
                structure.append(event)
        block: AbstractContextManager[Any] = nullcontext()
        if position.batch_idx is not None:
            block = subject.context.batch(position.batch_idx, is_last=position.is_last)
        run.calls.append([])
        with block:
            for call, step in zip(position.calls, planned, strict=True):
                with reductions() if rank is not None else nullcontext() as issued:
                    subject.call(call, batches[position.index], cell, run.scales, step, rank is not None)
                run.calls[-1].append(subject.observe(issued))
        params = [_full(param) for head in subject.heads for param in head.parameters()]
        run.iterations.append(subject.observe(params=params, scales=len(run.scales)))
        if position.index in schedule.resume_after:
            subject = subject.resumed(make_context, schedule, cell, structure)
    for wrapper in subject.wrappers:
        state = wrapper.optimizer.state_dict()
        entries = {
            param: {key: _full(value) if isinstance(value, torch.Tensor) else value for key, value in entry.items()}
            for param, entry in state["state"].items()
        }
        run.optimizers.append({"state": entries, "param_groups": state["param_groups"]})
    run.scalers = grad_scaler_states(subject.context.state_dict())
    for taken, original, model, context_state in originals:
        what = f"the original of the copy taken {taken}, after the copy trained on"
        assert_unchanged(original.model, model, what)
        problem = state_diff(cloned(original.context.state_dict()), context_state, "context.state_dict()")
        assert problem is None, f"{what}: {problem}"
    return run


def oracle_run(
    schedule: Schedule, cell: Cell, on_failure: FailurePolicy = "discard"
) -> tuple[Run, list[list[Planned]]]:
    """The oracle's :class:`Run` of ``schedule`` (every wrapper's outcome pinned), and the plan of its calls."""
    oracle = ScheduleOracle(schedule, cell, on_failure)
    run, plan = Run(), list[list[Planned]]()

    def observe(**iteration: Any) -> Observed:
        unpinned, left = oracle.unpinned()
        outcomes = dict(enumerate(oracle.last_outcomes))
        observed = grads(oracle.model.parameters(), to_cpu=True)
        return Observed(outcomes, observed, unpinned=unpinned, left=left, **iteration)

    for position in schedule.iterations():
        oracle.begin(position)
        run.calls.append([])
        plan.append([])
        for call in position.calls:
            held = oracle.pending[call.optimizer]
            plan[-1].append(Planned(held, oracle.call(position, call) in REAL_STEP))
            run.calls[-1].append(observe())
        oracle.end(position)
        params = param_values(oracle.model.parameters(), to_cpu=True)
        run.iterations.append(observe(params=params, scales=len(oracle.scales)))
    run.scales = oracle.scales
    run.optimizers = [optimizer.state_dict() for optimizer in oracle.optimizers]
    run.scalers = [] if oracle.scaler is None else [oracle.scaler.state_dict()]
    return run, plan


def _assert_grads(got: list[list[torch.Tensor | None]], want: Observed, cell: Cell, factor: float, what: str) -> None:
    """Every parameter's gradient is the oracle's: ``None`` where its is, else the open windows' (scaled) sums.

    Under ``zero_grad_after_step=False`` a real step's gradients are what it applied (unscaled: compared at any loss
    scale), until ``zero_grad()`` or the next window takes them; those of a window that carries some are not pinned.

    Of several ranks, the mean of their own gradients (each window holds its own shard's sums, unsynced); under FSDP
    a shard holds no open window (what micro-steps without sync accumulate lives elsewhere): only a closed window,
    where the oracle has no gradient, is checked there. Compared relative to the largest gradient (the parameter
    tolerances assume values of order one), in the tolerance of reordered arithmetic; of several ranks relative to
    ``rtol`` too, as a half batch's gradients round in the autocast dtype on their own.
    """
    tol = REORDERED_TOLERANCES[cell.precision]
    # What a step applied is compared relative to the largest gradient it applied: a small one (a bias's, a mean of
    # residuals that cancel) rounds on each rank's shard of the batch in the autocast dtype on its own.
    applied = [want.grads[i] for i in want.left]
    largest = max(
        (float(g[g.isfinite()].abs().max()) for g in applied if g is not None and bool(g.isfinite().any())), default=0.0
    )
    for i, theirs in enumerate(want.grads):
        mine = [rank[i] for rank in got]
        if i in want.unpinned:
            continue
        if theirs is None:
            assert all(grad is None for grad in mine), (
                f"{what}: parameter {i} has a gradient on rank(s) {[r for r, g in enumerate(mine) if g is not None]}; "
                "the oracle's window is closed (gradients are cleared after a real step, or by zero_grad(), or a "
                "step skipped for non-finite gradients cleared them) [ZERO-001, ZERO-004]"
            )
            continue
        if cell.strategy == "fsdp":
            continue
        left = i in want.left
        missing = [r for r, g in enumerate(mine) if g is None]
        assert not missing, f"{what}: parameter {i} has no gradient on rank(s) {missing}; " + (
            "a real step taken under zero_grad_after_step=False leaves the gradients it applied until zero_grad() "
            "[ZERO-004]"
            if left
            else "the oracle's open window holds one"
        )
        scale = 1.0 if left else factor
        mean = torch.stack([cast(torch.Tensor, grad).double() for grad in mine]).mean(dim=0) / scale
        size = float(theirs[theirs.isfinite()].abs().max()) if bool(theirs.isfinite().any()) else 0.0
        size = max(size, largest) if left else size
        atol = (max(tol.atol, tol.rtol) if len(got) > 1 else tol.atol) * max(size, 1e-30)
        if not torch.allclose(mean, theirs.double(), rtol=tol.rtol, atol=atol, equal_nan=True):
            raise AssertionError(
                f"{what}: the gradient of parameter {i} (mean over {len(got)} rank(s)) differs from the oracle's (max "
                f"abs diff {float((mean - theirs.double()).abs().nan_to_num().max()):.3g} on gradients of size "
                f"{size:.3g}): "
                + (
                    "a real step taken under zero_grad_after_step=False leaves the gradients it applied (the "
                    "window's mean plus what it carried, unscaled and clipped) [ZERO-004, ZERO-005]"
                    if left
                    else "an open window holds the sum of its micro-batches' gradients"
                    + (f", at the current loss scale (x{factor:g} the oracle's)" if factor != 1.0 else "")
                    + (", each rank's its own shard's, unsynced [DDP-001, FSDP-002]" if len(got) > 1 else "")
                )
            )


def _assert_outcomes(got: list[Observed], want: Observed, what: str) -> None:
    """Every pinned ``last_outcome`` is its wrapper's own last call's, whichever wrapper was called last [STEP-004]."""
    for rank, observed in enumerate(got):
        expected = {index: want.outcomes[index] for index in observed.outcomes}
        assert observed.outcomes == expected, (
            f"{what}{f', rank {rank}' if len(got) > 1 else ''}: last_outcome per wrapper "
            f"{dict(zip(observed.outcomes, outcome_names(observed.outcomes.values()), strict=True))}, expected "
            f"{dict(zip(expected, outcome_names(expected.values()), strict=True))} [STEP-004]"
        )


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
    assert [scale / factor for scale in got] == want, (
        f"{what}: the loss scales of the backward passes were {got}; the scaler "
        + ("built with the settings given to the factory, " if exact else "")
        + f"updated once per iteration after every optimizer that stepped gives {[scale * factor for scale in want]}"
    )


def _assert_final_state(got: Run, want: Run, schedule: Schedule, cell: Cell) -> None:
    """The inner optimizers' state (Adam's step counts included) and the loss scaler's state are the oracle's."""
    tol = tolerance_for(cell)
    for index, (got_dict, want_dict) in enumerate(zip(got.optimizers, want.optimizers, strict=True)):
        for group, (mine, theirs) in enumerate(zip(got_dict["param_groups"], want_dict["param_groups"], strict=True)):
            differ = {key: mine.get(key) for key, value in theirs.items() if mine.get(key) != value}
            assert not differ, f"optimizer {index}, parameter group {group}: {differ}, the oracle's group is {theirs}"
        states, expected = got_dict["state"], want_dict["state"]
        # A fused optimizer under a plain GradScaler creates step-0 state on a skipped step; an implementation that
        # never calls the inner step on a skip leaves none, as AMP-004 allows: such entries may be missing.
        untouched = {param for param, entry in expected.items() if "step" in entry and float(entry["step"]) == 0}
        assert set(states) <= set(expected) and set(expected) - set(states) <= untouched, (
            f"optimizer {index}: state for parameters {sorted(states)}, expected {sorted(expected)}"
        )
        for param, entry in expected.items():
            if param not in states:
                continue
            keys = sorted(states[param])
            assert keys == sorted(entry), (
                f"optimizer {index}, parameter {param}: state keys {keys}, not {sorted(entry)}"
            )
            for key, value in entry.items():
                mine_value = states[param][key]
                where = f"optimizer {index} ({schedule.heads[index].kind}), parameter {param}, state {key!r}"
                if key == "step":
                    assert float(mine_value) == float(value), (
                        f"{where}: {float(mine_value)} real steps, not {float(value)}"
                    )
                elif isinstance(value, torch.Tensor):
                    close = torch.allclose(
                        mine_value.cpu().double(), value.cpu().double(), rtol=tol.rtol, atol=tol.atol
                    )
                    assert close, f"{where} differs from the oracle's"
    if want.scalers and len(got.scalers) == 1:  # a GradScaler's own state dict: its growth tracker is observable
        found, want_state = got.scalers[0], want.scalers[0]
        assert found["_growth_tracker"] == want_state["_growth_tracker"], (
            f"the loss scaler's growth tracker is {found['_growth_tracker']}, expected "
            f"{want_state['_growth_tracker']} (one update per iteration in which an optimizer stepped)"
        )
        if got.scales:
            factor = _scale_factor(got.scales, want.scales)
            assert found["scale"] == want_state["scale"] * factor, (
                f"the loss scaler's final scale is {found['scale']}, expected {want_state['scale'] * factor} "
                f"(the oracle's, times the ratio {factor} of the first loss scales)"
            )


def assert_matches(runs: list[Run], want: Run, schedule: Schedule, cell: Cell) -> None:
    """Each rank's run (one at world size 1) is the oracle's.

    Per call the pinned outcomes, the reductions (of several ranks: some in a call that closes a window, none in
    another) and the gradients; per iteration the parameters (identical on every rank, in the tolerance of
    reordered arithmetic when several), gradients, outcomes and loss scales; at the end the optimizers' and the
    loss scaler's state.
    """
    exact = schedule.grad_scaler is not None and bool(want.scalers)
    factor = 1.0 if exact else _scale_factor(runs[0].scales, want.scales)
    tol = tolerance_for(cell) if len(runs) == 1 else REORDERED_TOLERANCES[cell.precision]
    sync_rule = "[FSDP-002]" if cell.strategy == "fsdp" else "[DDP-001]"
    for position, wants, end in zip(schedule.iterations(), want.calls, want.iterations, strict=True):
        where = f"{_where(position)} (accumulate_grad_batches={schedule.accumulate_grad_batches})"
        for j, (call, expected) in enumerate(zip(position.calls, wants, strict=True)):
            what, got = f"{where}, {call}", [run.calls[position.index][j] for run in runs]
            _assert_outcomes(got, expected, what)
            closes = expected.outcomes[call.optimizer] in REAL_STEP
            for rank, count in enumerate(observed.reductions for observed in got):
                if count is not None:
                    assert (count > 0) == closes, f"{what}, rank {rank}: " + (
                        "the call closes its window, yet it issued no reducing operation of the process group: the "
                        f"window's gradients were never synced {sync_rule}"
                        if closes
                        else f"the call does not close its window, yet it issued {count} reducing operation(s) of the "
                        f"process group: micro-steps that do not close a window run without gradient sync {sync_rule}"
                    )
            _assert_grads([observed.grads for observed in got], expected, cell, factor, what)
        got = [run.iterations[position.index] for run in runs]
        what = f"end of {where}, calls {list(position.calls)}"
        _assert_outcomes(got, end, what)
        _assert_grads([observed.grads for observed in got], end, cell, factor, what)
        for rank, other in enumerate(got[1:], start=1):
            assert_same_values(
                other.params, got[0].params, f"{what}: rank {rank}'s parameters against rank 0's [DDP-002, FSDP-003]"
            )
        for i, (mine, theirs) in enumerate(zip(got[0].params, end.params, strict=True)):
            assert torch.allclose(mine.double(), theirs.double(), rtol=tol.rtol, atol=tol.atol), (
                f"{what}: parameter {i} differs from the plain-PyTorch oracle on {cell.id} by "
                f"{float((mine.double() - theirs.double()).abs().max()):.3g} (rtol {tol.rtol}, atol {tol.atol}) "
                "[DDP-002, FSDP-003]"
            )
        scales = runs[0].scales[: got[0].scales], want.scales[: end.scales]
        _assert_scales(*scales, bool(want.scalers), exact, where)
    _assert_final_state(runs[0], want, schedule, cell)
