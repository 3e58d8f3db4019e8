"""Checks that a real step hands the inner optimizer a closure, as torch's optimizers expect (CLOS-005).

Two optimizers written here stand for the two ways an optimizer uses its closure: ``RecordingSGD`` calls it once
at the start, as every torch first-order optimizer does, and records that it got one; ``TwoPassSAM`` (sharpness-aware
minimisation, torch's closure convention) calls it, moves to a perturbed point, calls it again and steps from the
first point with the second gradient. The oracles are the same optimizers stepped by hand with plain closures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_same_grads, grads, last_outcome, param_values
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    UNSCALED_PRECISIONS,
    Batch,
    Halves,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.optimizer_kinds import RecordingSGD, TwoPassSAM, closure_of, toggled_closure
from lightning_optimizer.conformance.oracles import WindowOracle, oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    clipper,
    oracle_loss,
    real_step,
    scaled_backward,
    train_windows,
    window_mean,
)
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
EAGER_UNSCALED = pytest.mark.cells(devices=("cpu", "cuda"), precisions=UNSCALED_PRECISIONS)
"""Where a two-pass optimizer runs: outside 16-mixed (torch's GradScaler takes no closure), eager devices."""


def _sam_beside_sgd_oracle_batch(
    oracle: Halves, sam: TwoPassSAM, sgd: torch.optim.SGD, batch: Batch, steps: bool, clip: float | None, cell: Cell
) -> None:
    """One batch of the SAM-beside-SGD check's plain loop: bare SAM on half ``a``, then (``steps``) SGD on ``b``.

    SAM's closure zeroes, toggles half ``b`` off by hand while it evaluates both halves' loss, and clips by norm by
    hand; the SGD step's gradient is clipped by hand too.
    """
    clip_norm = None if clip is None else clipper("norm", clip)

    def loss_of() -> torch.Tensor:
        return oracle_loss(oracle.a, batch, cell, factor=1.0) + oracle_loss(oracle.b, batch, cell, factor=1.0)

    oracle_closure = toggled_closure(sam, loss_of, oracle.b.parameters(), clip_norm)
    sam.step(oracle_closure)
    sam.zero_grad(set_to_none=True)
    if steps:
        scaled_backward(oracle_loss(oracle.b, batch, cell, factor=1.0), None)
        real_step(sgd, 1, None, clip=clip_norm)


SCHEDULES: dict[str, Sequence[bool | None]] = {
    "windows 1, 3, 2 by make_optimizer_step": (True, False, False, True, False, True),
    "windows 2, 1, 3, mixed with the schedule of 2": (False, True, None, False, False, None),
}


@pytest.mark.requirement("CLOS-005", "CLOS-001", "STEP-006")
@pytest.mark.cells(devices=("cpu", "cuda"))  # on XLA the Lightning tests hand closures through the same step
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES)
@pytest.mark.varies(
    optimizer=("SGD momentum", "step(closure) recorded"),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True"),
    make_optimizer_step=("True", "False", "None"),
)
def test_a_real_step_hands_the_inner_optimizer_the_closure(
    make_context: MakeContext, cell: Cell, schedule: Sequence[bool | None]
) -> None:
    """Each real step's inner ``step`` gets a closure (none under 16-mixed); the call's closure still runs once.

    The closure handed over returns the call's own result without running again: the trajectory is a plain SGD's
    on each window's mean, and each ``step()`` returns what its closure returned.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(len(schedule), seed=5)
    context = make_context(accumulate_grad_batches=2)
    base = make_model(seed=3)
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    inner = RecordingSGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapper = context.wrap(inner)
    ran: list[int] = []
    for batch_idx, (batch, make_step) in enumerate(zip(batches, schedule, strict=True)):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            returned: list[torch.Tensor] = []

            def closure(
                batch: Batch = batch, batch_idx: int = batch_idx, returned: list[torch.Tensor] = returned
            ) -> Any:
                ran.append(batch_idx)
                with context.autocast():
                    loss = mse(model, batch, device, dtype)
                wrapper.backward(loss)
                returned.append(loss)
                return loss

            got = wrapper.step(closure, make_optimizer_step=make_step)
            assert got is returned[0], f"batch {batch_idx}: step() must return the closure's result (STEP-006)"
    assert ran == list(range(len(batches))), f"the closure must run once per call, ran for batches {ran}"

    windows, window = [], []
    for batch_idx, make_step in enumerate(schedule):
        window.append(batch_idx)
        closes = make_step if make_step is not None else (batch_idx + 1) % 2 == 0 or batch_idx == len(schedule) - 1
        if closes:
            windows.append(window)
            window = []
    oracle = WindowOracle(oracle_model, torch.optim.SGD(oracle_model.parameters(), lr=0.1, momentum=0.9), cell, 2)
    oracle.train_windows(batches, windows)
    assert_params_close(model, oracle_model, cell, "SGD stepped through step(closure)")
    taken = sum(oracle.stepped)
    if cell.precision == "16-mixed":
        assert inner.received == [False] * taken, "under 16-mixed the inner step gets no closure (CLOS-005)"
    else:
        assert inner.received == [True] * taken, (
            f"each real step must hand the inner optimizer a closure (CLOS-005); it got one in {inner.received}"
        )


@pytest.mark.requirement("CLOS-005", "CLOS-001", "CLOS-004", "CLIP-001", "TOGGLE-001", "STEP-006")
@EAGER_UNSCALED
@pytest.mark.parametrize("clip", [None, 0.05], ids=["unclipped", "clipped by norm"])
@pytest.mark.varies(
    optimizer=("two-pass (SAM)", "SGD"),
    wrappers=("1", "2"),
    clipping=("norm",),
    call_form=("closure, wrapper.backward",),
)
def test_a_two_pass_optimizer_evaluates_the_closure_again(
    make_context: MakeContext, cell: Cell, clip: float | None
) -> None:
    """SAM's second evaluation is a fresh one: cleared gradients, toggled to its own parameters, clipped.

    Beside it an SGD wrapper steps every other batch; the oracle is a bare ``TwoPassSAM`` whose closure zeroes,
    freezes the SGD half and clips by hand, and a bare SGD.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(4, seed=9)
    context = make_context(gradient_clip_val=clip)
    base = Halves(41, 42)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    sam = context.wrap(TwoPassSAM(model.a.parameters()))
    sgd = context.wrap(torch.optim.SGD(model.b.parameters(), lr=0.1))
    oracle_sam, oracle_sgd = TwoPassSAM(oracle.a.parameters()), torch.optim.SGD(oracle.b.parameters(), lr=0.1)
    evaluations: list[list[bool]] = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            returned: list[torch.Tensor] = []

            def closure(batch: Batch = batch, returned: list[torch.Tensor] = returned) -> torch.Tensor:
                evaluations.append([p.requires_grad for p in model.b.parameters()])
                with context.autocast():
                    loss = mse(model.a, batch, device, dtype) + mse(model.b, batch, device, dtype)
                sam.backward(loss)
                returned.append(loss)
                return loss

            got = sam.step(closure, make_optimizer_step=True)
            assert sam.last_outcome is StepOutcome.STEPPED
            assert len(returned) == 2, f"batch {batch_idx}: SAM evaluated the closure {len(returned)} times, not 2"
            assert got is returned[0], "step() must return the first evaluation's result (STEP-006)"
            if batch_idx % 2 == 1:
                sgd.step(closure_of(context, sgd, model.b, batch, cell), make_optimizer_step=True)
        _sam_beside_sgd_oracle_batch(oracle, oracle_sam, oracle_sgd, batch, batch_idx % 2 == 1, clip, cell)
    assert all(not any(flags) for flags in evaluations), "in every SAM evaluation only its parameters require grad"
    assert all(p.requires_grad for p in model.parameters())
    assert_params_close(model, oracle, cell, "a two-pass optimizer beside an SGD wrapper", tolerance_for(cell))


def _two_pass_oracle(oracle: Halves, window: Sequence[Batch], retry: Batch, other: Sequence[Batch], cell: Cell) -> None:
    """The plain loop of the SAM check: bare SAM on half ``a``, bare SGD on half ``b``.

    SAM's first evaluation is the mean over ``window``, each further one ``retry`` anew; SGD steps on ``other``'s mean.
    """
    sam, calls = TwoPassSAM(oracle.a.parameters()), list[int]()

    def oracle_closure() -> torch.Tensor:
        sam.zero_grad(set_to_none=True)
        batches = [retry] if calls else window
        calls.append(len(batches))
        for batch in batches:
            loss = oracle_loss(oracle.a, batch, cell, factor=1.0)
            scaled_backward(loss, None)
        window_mean(oracle.a.parameters(), len(batches), None)
        return loss

    sam.step(oracle_closure)
    sgd = torch.optim.SGD(oracle.b.parameters(), lr=0.1)
    train_windows(cell, oracle.b, sgd, other, [range(len(other))], None, factor=1.0)


def _counting(context: TrainingContext, cell: Cell, evaluations: list[int]) -> Callable[..., Callable[[], Any]]:
    """``closure_for(wrapper, half, batch, fail_at=0)``: :func:`.closure_of` counting itself in ``evaluations``.

    The evaluation that makes the count ``fail_at`` raises after its backward.
    """

    def closure_for(wrapper: Any, half: Any, batch: Batch, fail_at: int = 0) -> Callable[[], Any]:
        evaluate = closure_of(context, wrapper, half, batch, cell)

        def closure() -> torch.Tensor:
            evaluations.append(1)
            loss = evaluate()
            if len(evaluations) == fail_at:
                raise RuntimeError("the second evaluation fails after its backward")
            return loss

        return closure

    return closure_for


@pytest.mark.requirement("CLOS-003", "CLOS-005", "FAIL-003", "FAIL-004", "FAIL-002")
@EAGER_UNSCALED
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    optimizer=("two-pass (SAM)", "SGD"),
    faults=("raising closure after its backward",),
    on_failure=("discard", "restore"),
    wrappers=("2",),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    make_optimizer_step=("True", "False"),
    call_form=("closure, wrapper.backward",),
)
def test_a_two_pass_optimizer_whose_second_evaluation_raises(
    make_context: MakeContext, cell: Cell, on_failure: str
) -> None:
    """A SAM step whose second evaluation (SAM's own call of the closure) raises after its backward.

    The exception propagates. Under ``"restore"`` the window's gradients, length and outcome are as before the call
    (not averaged, without either evaluation's gradients); under ``"discard"`` the window is gone (every gradient
    ``None``, ``DISCARDED``). The SGD wrapper's open window is untouched either way. The parameters SAM moved before
    the evaluation raised are its own to restore (the check puts them back, as its user would); the retry then steps
    as a bare SAM on the window each policy leaves.
    """
    batches, discard = make_batches(3, seed=19), on_failure == "discard"
    context = make_context(accumulate_grad_batches=2, **failure_settings(on_failure))
    base = Halves(43, 44)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    sam = context.wrap(TwoPassSAM(model.a.parameters()))
    sgd = context.wrap(torch.optim.SGD(model.b.parameters(), lr=0.1))
    evaluations: list[int] = []
    closure_for = _counting(context, cell, evaluations)
    sam.step(closure_for(sam, model.a, batches[0]), make_optimizer_step=False)
    sgd.step(closure_for(sgd, model.b, batches[0]), make_optimizer_step=False)
    values, window, other = param_values(model.parameters()), grads(model.a.parameters()), grads(model.b.parameters())
    evaluations.clear()
    with refuses(
        RuntimeError,
        "a SAM wrapper's closing step() whose closure raises in SAM's second evaluation, after its backward",
        "CLOS-003: the exception of a closure that raises in a later evaluation propagates out of step()",
        match="second evaluation",
    ):
        sam.step(closure_for(sam, model.a, batches[1], fail_at=2), make_optimizer_step=True)
    what = f"a SAM step whose second evaluation raised (on_failure={on_failure!r})"
    assert len(evaluations) == 2, f"{what}: the closure ran {len(evaluations)} times, SAM's second run raised"
    assert_same_grads(grads(model.b.parameters()), other, f"{what}: the SGD wrapper's open window changed (FAIL-002)")
    assert sgd.last_outcome is StepOutcome.ACCUMULATED, f"{what}: the SGD wrapper's outcome {sgd.last_outcome}"
    want = ([None] * len(window), StepOutcome.DISCARDED) if discard else (window, StepOutcome.ACCUMULATED)
    leaves = "gone (FAIL-003)" if discard else "as before the call (CLOS-003, FAIL-004)"
    assert_same_grads(grads(model.a.parameters()), want[0], f"{what}: SAM's window is not {leaves}")
    assert sam.last_outcome is want[1], f"{what}: last_outcome {sam.last_outcome}, the window {leaves}"
    with torch.no_grad():  # SAM moved its parameters before the evaluation raised: its user puts them back
        for param, value in zip(model.parameters(), values, strict=True):
            param.copy_(value)
    evaluations.clear()
    sam.step(closure_for(sam, model.a, batches[1]), make_optimizer_step=True)
    assert last_outcome(sam) is StepOutcome.STEPPED, f"the retry after {what}: {last_outcome(sam)}"
    sgd.step(closure_for(sgd, model.b, batches[1]), make_optimizer_step=True)
    _two_pass_oracle(oracle, [batches[1]] if discard else batches[:2], batches[1], batches[:2], cell)
    assert_params_close(model, oracle, cell, f"the retry after {what}", tolerance_for(cell))
