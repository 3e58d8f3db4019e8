"""Property checks: generated training schedules against the plain-PyTorch schedule oracle.

Hypothesis generates whole loops (:class:`~lightning_optimizer.conformance.schedule_oracle.Schedule`): one to
three optimizers, ``make_optimizer_step`` ``True``/``False``/``None`` per call, ``accumulate_grad_batches`` 1 to
4, epochs whose length leaves partial windows, the closure form (``wrapper.backward`` or ``loss.backward()``) and
the backward-then-step form, ``zero_grad()`` calls, injected non-finite losses under 16-mixed, closures that
raise, and checkpoints resumed between iterations. After every iteration the
implementation's outcomes, parameters and loss scales must be the oracle's; at the end, its optimizer state.

The suite runs a fixed, derandomised budget per cell (``CI_EXAMPLES``; ``--property-examples=N`` runs ``N``
schedules per check, and shrinks a failing one to a minimal example). The checks run on the eager devices at
world size 1: on XLA every generated schedule compiles new graphs (minutes per cell), and the DDP ranks run in
the rank pool's processes, where the DDP checks cover what world size 2 adds (``no_sync``, identical ranks).
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from lightning_optimizer.conformance.harness import Batch, assert_params_close, tolerance_for
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.schedule_oracle import (
    CALL_FORMS,
    OPTIMIZER_KINDS,
    Call,
    CallForm,
    IterationPosition,
    Schedule,
    ScheduleModel,
    ScheduleOracle,
    make_optimizer,
    schedule_batches,
    schedule_loss,
)
from lightning_optimizer.spec import Cell, OptimizerWrapper, StepOutcome, TrainingContext

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

CI_EXAMPLES = {"oracle": 40, "faults": 25, "resume": 20}
"""Generated schedules per check and cell in a plain run (besides the explicit examples)."""

_GRAD_SCALER_KEYS = frozenset({"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})


class ScheduleFault(RuntimeError):
    """What a generated closure raises on purpose."""


# -- driving an implementation through a schedule ------------------------------------------------------------


@dataclass
class _Subject:
    """The implementation under test, set up for one schedule."""

    context: TrainingContext
    model: ScheduleModel
    wrappers: list[OptimizerWrapper[Any]]

    @classmethod
    def build(cls, make_context: MakeContext, schedule: Schedule) -> _Subject:
        context = make_context(accumulate_grad_batches=schedule.accumulate_grad_batches)
        model = context.prepare_module(ScheduleModel(len(schedule.optimizers)))
        assert isinstance(model, ScheduleModel), f"prepare_module returned a {type(model).__name__} at world size 1"
        wrappers = [
            context.wrap(make_optimizer(kind, model.head_parameters(i))) for i, kind in enumerate(schedule.optimizers)
        ]
        return cls(context, model, wrappers)

    def resumed(self, make_context: MakeContext, schedule: Schedule) -> _Subject:
        """Checkpoint (model, each wrapper's ``state_dict``, the context's), then load it into fresh objects."""
        buffer = io.BytesIO()
        state = {
            "model": self.model.state_dict(),
            "optimizers": [wrapper.state_dict() for wrapper in self.wrappers],
            "context": self.context.state_dict(),
        }
        torch.save(state, buffer)
        fresh = _Subject.build(make_context, schedule)
        saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        fresh.model.load_state_dict(saved["model"])
        for wrapper, optimizer_state in zip(fresh.wrappers, saved["optimizers"], strict=True):
            wrapper.load_state_dict(optimizer_state)
        fresh.context.load_state_dict(saved["context"])
        return fresh

    def call(self, call: Call, batch: Batch, cell: Cell, scales: list[float]) -> StepOutcome | None:
        """One call of the schedule (after a first attempt that raises, when the call says so)."""
        wrapper = self.wrappers[call.optimizer]
        if call.zero_grad_first:
            wrapper.zero_grad()
        if call.raises_first:
            self._raising_attempt(call, batch, cell)
        self._attempt(call, batch, cell, scales, raising=False)
        return wrapper.last_outcome

    def _attempt(self, call: Call, batch: Batch, cell: Cell, scales: list[float], *, raising: bool) -> None:
        wrapper = self.wrappers[call.optimizer]

        def record_scale(grad: torch.Tensor) -> None:
            # The gradient reaching the loss is the factor the loss was scaled by before its backward pass.
            scales.append(float(grad))

        def forward_backward() -> torch.Tensor:
            with self.context.autocast():
                loss = schedule_loss(self.model, call.optimizer, batch, cell, non_finite=call.non_finite)
            if raising:
                raise ScheduleFault(f"optimizer {call.optimizer}'s closure fails on purpose")
            loss.register_hook(record_scale)
            if call.form == "closure_plain_backward":
                loss.backward()
            else:
                wrapper.backward(loss)
            return loss

        if call.form == "toggle_model":
            with wrapper.toggle_model():
                forward_backward()
            wrapper.step(make_optimizer_step=call.make_optimizer_step)
        else:
            wrapper.step(forward_backward, make_optimizer_step=call.make_optimizer_step)

    def _raising_attempt(self, call: Call, batch: Batch, cell: Cell) -> None:
        """The attempt raises; flags, parameters and every gradient must be exactly as before [CLOS-003]."""
        params = list(self.model.parameters())
        flags = [param.requires_grad for param in params]
        values = [param.detach().clone() for param in params]
        grads = [None if param.grad is None else param.grad.detach().clone() for param in params]
        with pytest.raises(ScheduleFault):
            self._attempt(call, batch, cell, [], raising=True)
        what = f"after {call} raised in its {'toggle_model block' if call.form == 'toggle_model' else 'closure'}"
        assert [param.requires_grad for param in params] == flags, f"{what}: requires_grad flags were not restored"
        for i, (param, value, grad) in enumerate(zip(params, values, grads, strict=True)):
            unchanged = _identical(param.detach(), value)
            assert unchanged, f"{what}: parameter {i} changed"
            if grad is None:
                assert param.grad is None, f"{what}: parameter {i} has a gradient it did not have before"
            else:
                unchanged = param.grad is not None and _identical(param.grad, grad)
                assert unchanged, f"{what}: the gradient of parameter {i} changed"


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, a NaN matching a NaN (an overflowed window's gradients are not finite)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _values(outcomes: list[StepOutcome] | list[StepOutcome | None]) -> list[str | None]:
    return [None if outcome is None else outcome.value for outcome in outcomes]


def _where(position: IterationPosition) -> str:
    last = ", the epoch's last" if position.is_last else ""
    return f"iteration {position.index} (epoch {position.epoch}, batch {position.batch_idx}{last})"


def _assert_scales(got: list[float], want: list[float], scaled: bool, what: str) -> None:
    """The loss scale of each backward pass: 1 without a scaler; with one, the oracle's up to a constant factor."""
    assert len(got) == len(want), f"{what}: {len(got)} backward passes were seen, the schedule makes {len(want)}"
    if not got:
        return
    if not scaled:
        assert all(scale == 1.0 for scale in got), f"{what}: losses were scaled by {got} without a loss scaler"
        return
    factor = got[0] / want[0]
    relative = [scale / factor for scale in got]
    assert relative == want, (
        f"{what}: the loss scales of the backward passes were {got}; the scaler updated once per iteration after "
        f"every optimizer that stepped gives {[scale * factor for scale in want]}"
    )


def _grad_scaler_states(state: object) -> list[dict[str, Any]]:
    """Every ``GradScaler.state_dict()`` (recognised by its keys) nested in a context's state."""
    if isinstance(state, dict):
        if set(state) >= _GRAD_SCALER_KEYS:
            return [state]
        return [found for value in state.values() for found in _grad_scaler_states(value)]
    if isinstance(state, list | tuple):
        return [found for value in state for found in _grad_scaler_states(value)]
    return []


def _assert_final_state(subject: _Subject, oracle: ScheduleOracle, cell: Cell, scales: list[float]) -> None:
    """The inner optimizers' state (Adam's step counts included) and the loss scaler's state are the oracle's."""
    tol = tolerance_for(cell)
    for index, (wrapper, optimizer) in enumerate(zip(subject.wrappers, oracle.optimizers, strict=True)):
        got, want = wrapper.optimizer.state_dict()["state"], optimizer.state_dict()["state"]
        assert set(got) == set(want), f"optimizer {index}: state for parameters {sorted(got)}, expected {sorted(want)}"
        for param, entry in want.items():
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
    found = _grad_scaler_states(subject.context.state_dict())
    if len(found) == 1:  # the context keeps a GradScaler's own state dict: its growth tracker is observable
        want_state = oracle.scaler.state_dict()
        assert found[0]["_growth_tracker"] == want_state["_growth_tracker"], (
            f"the loss scaler's growth tracker is {found[0]['_growth_tracker']}, expected "
            f"{want_state['_growth_tracker']} (one update per iteration in which an optimizer stepped)"
        )
        if scales:
            factor = scales[0] / oracle.scales[0]
            assert found[0]["scale"] == want_state["scale"] * factor, (
                f"the loss scaler's final scale is {found[0]['scale']}, expected {want_state['scale'] * factor} "
                f"(the oracle's, times the ratio {factor} of the first loss scales)"
            )


def _run_schedule(make_context: MakeContext, cell: Cell, schedule: Schedule) -> list[list[torch.Tensor]]:
    """Run ``schedule`` on the implementation and the oracle side by side; return the parameters per iteration."""
    oracle = ScheduleOracle(schedule, cell)
    subject = _Subject.build(make_context, schedule)
    batches = schedule_batches(schedule)
    scales: list[float] = []
    steps = [0] * len(schedule.optimizers)
    trajectory = []
    for position in schedule.iterations():
        expected = oracle.iteration(position)
        outcomes = []
        where = _where(position)
        with subject.context.batch(position.batch_idx, is_last=position.is_last):
            for call in position.calls:
                outcome = subject.call(call, batches[position.index], cell, scales)
                outcomes.append(outcome)
                steps[call.optimizer] += outcome is StepOutcome.STEPPED
                if outcome in REAL_STEP:
                    own = subject.model.head_parameters(call.optimizer)
                    assert all(param.grad is None for param in own), (
                        f"{where}: optimizer {call.optimizer}'s gradients survived its real step"
                    )
        assert outcomes == expected, (
            f"{where}: outcomes {_values(outcomes)}, expected {_values(expected)} "
            f"for the calls {list(position.calls)} (accumulate_grad_batches={schedule.accumulate_grad_batches})"
        )
        assert_params_close(subject.model, oracle.model, cell, f"{where}, calls {list(position.calls)}")
        _assert_scales(scales, oracle.scales, oracle.scaler is not None, where)
        trajectory.append([param.detach().cpu().clone() for param in subject.model.parameters()])
        if position.index in schedule.resume_after:
            subject = subject.resumed(make_context, schedule)
    assert steps == oracle.steps, f"real steps taken per optimizer: {steps}; skipped ones do not count: {oracle.steps}"
    _assert_final_state(subject, oracle, cell, scales)
    return trajectory


# -- schedules -----------------------------------------------------------------------------------------------


def _draw_schedule(draw: DrawFn, cell: Cell, *, faults: bool, resumes: bool) -> Schedule:
    """A random schedule; non-finite losses only under 16-mixed, raising attempts and checkpoints when asked."""
    sixteen_mixed = cell.precision == "16-mixed"
    count = draw(st.integers(1, 3))
    optimizers = tuple(draw(st.sampled_from(OPTIMIZER_KINDS)) for _ in range(count))
    accumulate = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 7), min_size=1, max_size=2))
    # 16-mixed: a plain loss.backward() would skip the loss scaling that the wrapper owes [ACC-002].
    forms = tuple(form for form in CALL_FORMS if not (sixteen_mixed and form == "closure_plain_backward"))
    epochs = []
    for length in lengths:
        iterations = []
        for _ in range(length):
            order = draw(st.permutations(range(count)))
            calls = tuple(
                Call(
                    optimizer,
                    make_optimizer_step=draw(st.sampled_from((None, True, False, None))),
                    form=draw(st.sampled_from(forms)),
                    zero_grad_first=draw(st.booleans()),
                    non_finite=sixteen_mixed and draw(st.integers(0, 7)) == 0,
                    raises_first=faults and draw(st.integers(0, 3)) == 0,
                )
                for optimizer in order
                if draw(st.integers(0, 3)) > 0
            )
            iterations.append(calls)
        epochs.append(tuple(iterations))
    last = max(sum(lengths) - 2, 0)
    resume_after = frozenset(draw(st.sets(st.integers(0, last), min_size=1, max_size=2))) if resumes else frozenset()
    return Schedule(optimizers, accumulate, tuple(epochs), resume_after)


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
            (Call(0, raises_first=faults), Call(2, form="toggle_model", raises_first=faults), Call(1, form=plain)),
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
    return Schedule(("sgd", "sgd", "adam"), 3, epochs, frozenset({1, 5}) if resumes else frozenset())


def _check_schedules(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cell: Cell,
    budget: str,
    check: Callable[[Schedule], None],
    *,
    faults: bool = False,
    resumes: bool = False,
) -> None:
    """Run ``check`` on the explicit schedule, then on generated ones (derandomised, no example database)."""
    if HYPOTHESIS_MISSING is not None:
        unavailable(HYPOTHESIS_MISSING)
    requested = request.config.getoption("property_examples", default=None)
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if requested else ())
    strategy: SearchStrategy[Schedule] = st.composite(_draw_schedule)(cell, faults=faults, resumes=resumes)

    @settings(
        max_examples=int(requested) if requested else CI_EXAMPLES[budget],
        derandomize=True,
        database=None,
        deadline=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @example(schedule=_explicit_schedule(cell, faults=faults, resumes=resumes))
    @given(schedule=strategy)
    def run(schedule: Schedule) -> None:
        check(schedule)

    with _quiet_process_state(tmp_path_factory.getbasetemp() / "hypothesis"):
        run()


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
    "TOGGLE-001",
    "AMP-003",
    "AMP-004",
    "AMP-006",
)
@pytest.mark.cells(devices=EAGER)
def test_generated_schedules_match_the_oracle(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Generated schedules: outcomes, parameters and loss scales after every iteration, state at the end."""

    def check(schedule: Schedule) -> None:
        _run_schedule(make_context, cell, schedule)

    _check_schedules(request, tmp_path_factory, cell, "oracle", check)


@pytest.mark.requirement("CLOS-003", "TOGGLE-002")
@pytest.mark.cells(devices=EAGER)
def test_generated_schedules_with_raising_closures(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A call whose closure (or ``toggle_model`` block) raises changes nothing; the schedule then goes on."""

    def check(schedule: Schedule) -> None:
        _run_schedule(make_context, cell, schedule)

    _check_schedules(request, tmp_path_factory, cell, "faults", check, faults=True)


@pytest.mark.requirement("CKPT-001", "CKPT-002", "PROXY-003")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(devices=EAGER)
def test_generated_schedules_resume_from_checkpoints(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Checkpoints resumed between iterations in fresh objects: the oracle's trajectory, bit for bit the same."""

    def check(schedule: Schedule) -> None:
        resumed = _run_schedule(make_context, cell, schedule)
        uninterrupted = _run_schedule(make_context, cell, dataclasses.replace(schedule, resume_after=frozenset()))
        for index, (got, want) in enumerate(zip(resumed, uninterrupted, strict=True)):
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                same = _identical(a, b)
                assert same, (
                    f"iteration {index}: parameter {i} after resuming at iterations {sorted(schedule.resume_after)} "
                    f"differs from the uninterrupted run by {(a.double() - b.double()).abs().max().item():.3g}"
                )

    _check_schedules(request, tmp_path_factory, cell, "resume", check, resumes=True)
