"""Checks of optimizers that evaluate the closure themselves (LBFGS), rule by rule, against a plain LBFGS.

LBFGS calls the closure as often as it needs on a real step. Every rule that applies to a step applies to each of
those evaluations: toggling, clipping, and on failure the roll-back of parameters, gradients and LBFGS's state.
Each oracle here is a bare ``torch.optim.LBFGS`` stepped with a closure that does by hand what the rule says
(toggles the other optimizer's parameters off, clips right after its backward).

LBFGS's data-dependent loop recompiles on every evaluation under XLA (minutes per cell): eager devices only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    assert_same_grads,
    assert_same_values,
    assert_unchanged,
    cloned,
    grads,
    last_outcome,
    param_values,
    snapshot,
    state_diff,
)
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    REORDERED_TOLERANCES,
    Halves,
    PlannedFailure,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
    refuses,
)
from lightning_optimizer.conformance.lbfgs_rig import LbfgsRig
from lightning_optimizer.conformance.plain_loop import ClipFunction, clipper
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED
LBFGS_CELLS = pytest.mark.cells(devices=("cpu", "cuda"), precisions=("64-true", "32-true", "16-true"))


def _alongside_sgd(make_context: MakeContext, cell: Cell, clip: ClipFunction | None = None, **settings: Any) -> None:
    """LBFGS steps twice, first while the SGD wrapper's window is open; each step checked against the oracle."""
    pair = LbfgsRig(make_context, cell, Halves(31, 32), clip=clip, **settings)
    batches = make_batches(4, seed=5)
    pair.sgd_step(batches[0], False)
    sgd_window, sgd_params = grads(pair.model.b.parameters()), param_values(pair.model.b.parameters())
    assert last_outcome(pair.lbfgs) is None, f"LBFGS's last_outcome is {last_outcome(pair.lbfgs)} before its first step"
    for step, (batch, make_step) in enumerate(((batches[1], None), (batches[3], True))):
        pair.step(batch, f"LBFGS step (make_optimizer_step={make_step})", make_step)
        what = f"LBFGS step {step} (make_optimizer_step={make_step})"
        pair.assert_toggled(what)
        assert pair.lbfgs.last_outcome is S, f"{what}: LBFGS's last_outcome is {pair.lbfgs.last_outcome}"
        assert all(p.grad is None for p in pair.model.a.parameters()), f"{what}: LBFGS's gradients are not None"
        if step == 0:
            assert pair.sgd.last_outcome is A, (
                f"{what} changed the SGD wrapper's last_outcome to {last_outcome(pair.sgd)}"
            )
            b_now = pair.model.b.parameters()
            assert_same_grads(
                grads(b_now), sgd_window, f"{what} changed the gradients of the SGD wrapper's open window"
            )
            assert_same_values(param_values(pair.model.b.parameters()), sgd_params, f"{what}: the SGD wrapper's")
            pair.sgd_step(batches[2], True)
            pair.oracle_sgd_window([batches[0], batches[2]])
            assert pair.sgd.last_outcome is S, f"the SGD wrapper's window did not step: {pair.sgd.last_outcome}"
            assert pair.lbfgs.last_outcome is S, (
                f"the SGD wrapper's step changed LBFGS's last_outcome to {last_outcome(pair.lbfgs)}"
            )
    assert pair.sgd.last_outcome is S, f"LBFGS's step changed the SGD wrapper's last_outcome to {pair.sgd.last_outcome}"
    tol = REORDERED_TOLERANCES[cell.precision]
    assert_params_close(pair.model, pair.oracle, cell, "two LBFGS steps beside an SGD window", tol)


@pytest.mark.requirement("TOGGLE-001", "TOGGLE-002", "ZERO-001", "STEP-004", "STEP-006", "CLOS-001")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(
    optimizer=("LBFGS", "SGD"),
    wrappers=("2",),
    window=("open while another optimizer steps",),
    make_optimizer_step=("True", "None"),
    outcome_read=("after every call of every wrapper",),
)
def test_lbfgs_beside_another_optimizer(make_context: MakeContext, cell: Cell) -> None:
    """In each LBFGS evaluation only its parameters require grad; outcomes, zeroing and the trajectory hold."""
    _alongside_sgd(make_context, cell)


@pytest.mark.requirement("CLIP-001")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.parametrize(("algorithm", "value"), [("norm", 0.05), ("value", 0.01)], ids=["norm", "value"])
@pytest.mark.varies(optimizer=("LBFGS", "SGD"), clipping=("norm", "value"), wrappers=("2",))
def test_lbfgs_clips_every_evaluation(make_context: MakeContext, cell: Cell, algorithm: str, value: float) -> None:
    """With ``gradient_clip_val``, LBFGS uses each evaluation's gradients clipped, as a clip after each backward."""
    clip = clipper(algorithm, value)
    _alongside_sgd(make_context, cell, clip, gradient_clip_val=value, gradient_clip_algorithm=algorithm)


@pytest.mark.requirement("CLOS-003", "CLOS-002", "TOGGLE-002", "FAIL-005", "FAIL-002")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    faults=("raising closure", "raising closure after its backward", "raising LBFGS evaluation"),
    optimizer=("LBFGS",),
    wrappers=("2",),
    window=("open while another optimizer steps",),
    on_failure=("discard", "restore"),
)
def test_failed_lbfgs_step_leaves_nothing_behind(make_context: MakeContext, cell: Cell, on_failure: str) -> None:
    """A closure that raises in any evaluation, or returns ``None``: the step raises and changes nothing.

    Under either failure policy (FAIL-005): LBFGS's parameters, gradients (those a backward left before the call
    included) and state are as before the call, and the SGD wrapper's open window is untouched (FAIL-002).
    """
    pair = LbfgsRig(make_context, cell, Halves(31, 32), **failure_settings(on_failure))
    model = pair.model
    batches = make_batches(3, seed=7)
    pair.step(batches[0])  # LBFGS has a history now, which a failed step must not extend
    pair.sgd_step(batches[1], False)
    pair.lbfgs.backward(mse(model.a, batches[2], pair.device, pair.dtype))  # gradients left from outside a step
    before, state = snapshot(model), cloned(pair.lbfgs.optimizer.state_dict())
    for at, what in (
        (1, "raised in its first evaluation"),
        (3, "raised in its third evaluation"),
        (0, "returned None"),
    ):
        seen: list[list[torch.Tensor]] = []  # LBFGS's parameters as each evaluation begins

        def closure(at: int = at, seen: list[list[torch.Tensor]] = seen) -> torch.Tensor | None:
            seen.append(param_values(model.a.parameters()))
            loss = pair.closure(batches[1])()
            if len(seen) == at:
                raise PlannedFailure(f"evaluation {at} failed after its backward")
            return loss if at else None

        why = (
            "CLOS-003: the exception of a closure that fails in any evaluation propagates out of step()"
            if at
            else "CLOS-002: a closure that returns None raises TypeError saying the closure must return the loss"
        )
        with refuses(
            PlannedFailure if at else TypeError, f"the LBFGS wrapper's step(closure) whose closure {what}", why
        ) as raised:
            pair.lbfgs.step(closure)
        if not at:  # not LBFGS's own float(None), which says nothing of the closure
            message = str(raised.value)
            assert "return" in message.lower(), (
                f"the TypeError of a closure that returned None says {message!r}: it must tell the user to return "
                "the loss from the closure (CLOS-002)"
            )
        if at == 3:
            assert len(seen) == 3 and any(not torch.equal(p, q) for p, q in zip(seen[2], seen[0], strict=True)), (
                "check precondition: LBFGS did not move the parameters before the third evaluation"
            )
        what = f"after an LBFGS step whose closure {what} (LBFGS's window and the open SGD window)"
        assert_unchanged(model, before, what)
        assert state_diff(pair.lbfgs.optimizer.state_dict(), state) is None, f"{what}: LBFGS's state dict changed"
    pair.evaluations.clear()
    pair.step(batches[2])
    pair.assert_toggled("the retry after the failed steps")
    pair.sgd_step(batches[0], True)
    pair.oracle_sgd_window([batches[1], batches[0]])
    what, tol = "the retry after failed LBFGS steps, and the SGD window", REORDERED_TOLERANCES[cell.precision]
    assert_params_close(model, pair.oracle, cell, what, tol)


@pytest.mark.requirement("CLOS-002")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(make_optimizer_step=("False", "None", "True"), optimizer=("LBFGS",))
def test_lbfgs_refuses_to_accumulate(make_context: MakeContext, cell: Cell) -> None:
    """``make_optimizer_step=False``, and ``accumulate_grad_batches=2``: ``ValueError`` before the closure runs."""
    batch = make_batches(1, seed=9)[0]
    lone = LbfgsRig(make_context, cell, make_model())
    model, oracle, wrapper, calls = lone.model, lone.oracle, lone.lbfgs, lone.evaluations
    for make_step in (None, True):  # refused before the first step (no state yet) and after one (a history)
        values, state = param_values(model.parameters()), cloned(wrapper.optimizer.state_dict())
        calls.clear()
        try:
            wrapper.step(lone.closure(batch), make_optimizer_step=False)
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"LBFGS's step(make_optimizer_step=False) was accepted (outcome {last_outcome(wrapper)}); expected a "
                f"ValueError before the closure runs (it ran {len(calls)} times)"
            )
        assert calls == [], "the closure ran before LBFGS with make_optimizer_step=False was refused"
        assert_same_values(param_values(model.parameters()), values, "a refused step(make_optimizer_step=False)")
        assert all(p.grad is None for p in model.parameters()), "a refused step left gradients"
        assert state_diff(wrapper.optimizer.state_dict(), state) is None, "a refused step changed LBFGS's state"
        lone.step(batch, f"step(make_optimizer_step={make_step}) after the refused one", make_step)
        assert wrapper.last_outcome is S, f"step(make_optimizer_step={make_step}): {wrapper.last_outcome}"
    assert_params_close(
        model, oracle, cell, "two LBFGS steps after refused accumulating steps", REORDERED_TOLERANCES[cell.precision]
    )

    accumulating = make_context(accumulate_grad_batches=2)
    lbfgs_model = accumulating.prepare_module(make_model())
    calls.clear()
    try:
        accumulating.wrap(torch.optim.LBFGS(lbfgs_model.parameters())).step(lone.closure(batch))
    except ValueError:
        pass
    else:
        raise AssertionError("LBFGS with accumulate_grad_batches=2 was accepted (by wrap and by step)")
    assert calls == [], "the closure ran before LBFGS with accumulate_grad_batches=2 was refused"


@pytest.mark.requirement("ERR-001", "ERR-002")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(faults=("invalid argument",), optimizer=("LBFGS",))
def test_lbfgs_step_refuses_bad_arguments(make_context: MakeContext, cell: Cell) -> None:
    """A non-callable closure or a non-bool ``make_optimizer_step``: ``TypeError``; LBFGS never starts a step."""
    batch = make_batches(1, seed=9)[0]
    lone = LbfgsRig(make_context, cell, make_model())
    model, oracle, wrapper, closure, calls = lone.model, lone.oracle, lone.lbfgs, lone.closure(batch), lone.evaluations
    inner_steps: list[int] = []
    wrapper.optimizer.register_step_pre_hook(lambda *args: inner_steps.append(1))
    device, dtype = cell_device(cell), cell_dtype(cell)

    lone.step(batch, "an LBFGS step")
    wrapper.backward(mse(model, batch, device, dtype))  # gradients left from outside a step
    before, state = snapshot(model), cloned(wrapper.optimizer.state_dict())
    bad: list[tuple[str, dict[str, Any]]] = [
        ("closure=3", {"closure": 3}),
        ("closure='loss'", {"closure": "loss"}),
        *(
            (f"make_optimizer_step={value!r}", {"closure": closure, "make_optimizer_step": value})
            for value in ("yes", 0, 1, 1.0, torch.tensor(True))
        ),
    ]
    for what, arguments in bad:
        calls.clear()
        inner_steps.clear()
        with refuses(
            TypeError,
            f"the LBFGS wrapper's step({what})",
            "ERR-001, ERR-002: a closure that is not callable, or a make_optimizer_step that is not a bool or None, "
            "is refused with TypeError before LBFGS starts a step",
        ):
            wrapper.step(**arguments)
        assert calls == [], f"step({what}): the closure ran before the argument was refused"
        assert inner_steps == [], f"step({what}): LBFGS's step started before the argument was refused"
        assert_unchanged(model, before, f"step({what})")
        assert state_diff(wrapper.optimizer.state_dict(), state) is None, f"step({what}) changed LBFGS's state"
    lone.step(batch, "an LBFGS step after refused arguments")
    assert_params_close(
        model, oracle, cell, "an LBFGS step after refused arguments", REORDERED_TOLERANCES[cell.precision]
    )


@pytest.mark.requirement("CLOS-002", "STEP-006")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(optimizer=("LBFGS",), wrappers=("1",))
def test_lbfgs_evaluates_the_closure_itself(make_context: MakeContext, cell: Cell) -> None:
    """LBFGS steps as a bare LBFGS does with the same closure, and returns what LBFGS returns."""
    batch = make_batches(1)[0]
    lone = LbfgsRig(make_context, cell, make_model(), {"lr": 0.5, "max_iter": 5})
    for step in range(2):
        lone.step(batch, f"LBFGS step {step}")
    assert len(lone.evaluations) > 2, "LBFGS was not allowed to evaluate the closure several times"
    assert_params_close(lone.model, lone.oracle, cell, "two LBFGS steps", REORDERED_TOLERANCES[cell.precision])
    lbfgs_context = make_context(accumulate_grad_batches=2)
    lbfgs_model = lbfgs_context.prepare_module(make_model())
    lbfgs = torch.optim.LBFGS(lbfgs_model.parameters())
    with refuses(
        ValueError,
        "wrap(LBFGS) in a context with accumulate_grad_batches=2, then its step(closure)",
        "CLOS-002: an LBFGS cannot accumulate, so wrap refuses it when accumulate_grad_batches > 1",
    ):
        lbfgs_context.wrap(lbfgs).step(lone.closure(batch))


_EVALUATION_CASES: tuple[tuple[int, int, str | None, str], ...] = (
    # max_iter, history_size, line_search_fn, the backward the closure calls
    (1, 100, None, "wrapper"),
    (3, 2, None, "loss"),
    (5, 3, "strong_wolfe", "wrapper"),
    (5, 100, None, "loss"),
)
"""One evaluation per step (max_iter=1: only a stale gradient can leak in), then several, with a short history
(the curvature pairs of earlier steps dropped) and a line search (evaluations at trial points)."""


@pytest.mark.requirement("CLOS-004")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(
    optimizer=("LBFGS",),
    wrappers=("1",),
    call_form=("closure, wrapper.backward", "closure, loss.backward"),
    zero_grad=("set_to_none=True", "set_to_none=False"),
)
@pytest.mark.parametrize("zeroing", ["none", "set_to_none", "zeros"], ids=["no-zero-grad", "zero-grad", "zeros"])
def test_lbfgs_evaluations_see_only_their_own_gradients(make_context: MakeContext, cell: Cell, zeroing: str) -> None:
    """Each LBFGS evaluation begins with no gradient, whether its closure zeroes (either way) or not.

    A gradient left on the parameters before the call (a backward outside any step) and each evaluation's own
    gradients must not reach the next evaluation: the trajectory is a bare LBFGS's whose closure zeroes first, and
    every evaluation of the wrapper's closure finds every gradient ``None``.
    """
    for max_iter, history_size, line_search_fn, backward in _EVALUATION_CASES:
        hyper = {"lr": 0.5, "max_iter": max_iter, "history_size": history_size, "line_search_fn": line_search_fn}
        case = f"LBFGS({hyper}), closure with {backward}.backward and zeroing {zeroing!r}"
        lone = LbfgsRig(make_context, cell, make_model(), hyper, zeroing=zeroing, backward=backward)
        stale = make_batches(1, seed=12)[0]
        for step, batch in enumerate(make_batches(3, seed=11)):
            lone.evaluations.clear()
            lone.oracle_evaluations = 0
            mse(lone.model, stale, cell_device(cell), cell_dtype(cell)).backward()  # left from outside any step
            assert all(p.grad is not None for p in lone.model.parameters()), "check precondition: no stale gradient"
            what = f"{case}, step {step}"
            lone.step(batch, what)
            with_grads = [(index, names) for index, (_, names) in enumerate(lone.evaluations) if names]
            assert not with_grads, (
                f"{what}: LBFGS evaluations began with gradients on the parameters (evaluation, parameters): "
                f"{with_grads}; each evaluation must begin from None, the stale gradient and the previous "
                "evaluation's gone"
            )
            assert len(lone.evaluations) == lone.oracle_evaluations, (
                f"{what}: LBFGS evaluated the closure {len(lone.evaluations)} times, the bare LBFGS "
                f"{lone.oracle_evaluations} times"
            )
            assert_params_close(lone.model, lone.oracle, cell, what, REORDERED_TOLERANCES[cell.precision])
