"""Checks of 16-mixed as torch's AMP recipe runs it: headroom per micro-step, and no unscaled backward in a closure.

AMP-007: each backward propagates the recipe's ``scaler.scale(loss / N)`` (``N = accumulate_grad_batches``), so a
window near float16's range is applied or skipped as the recipe's, and the real step applies the window's mean
whatever its length. The losses here are built from the oracle's current scale so that each micro-step's scaled
backward lands at a chosen height: ``edge`` (0.6 of float16's largest value at the recipe's ``loss / N``: finite
for the recipe, beyond float16 at ``N`` times that), ``low``, or ``over`` (beyond float16 even for the recipe, which
skips the window and backs off). AMP-008: a closure's backward that did not go through the wrapper is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_same_values, grads, param_values
from lightning_optimizer.conformance.edge_plans import (
    EdgePlan,
    Parts,
    draw_plan,
    edge_inputs,
    explicit_plan,
    loss_under,
    part_optimizer,
    run_edge_plan,
)
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    assert_discard_note,
    assert_params_close,
    assert_same_state,
    cell_device,
    failure_settings,
    oracle_autocast,
    refuses,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.plain_loop import PlainWindows
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

try:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    HYPOTHESIS_MISSING: str | None = None
except ImportError as exc:  # the suite's other checks run without it
    HYPOTHESIS_MISSING = f"hypothesis is not installed ({exc}); pip install hypothesis"

MakeContext = Callable[..., TrainingContext]
S = StepOutcome.STEPPED
EAGER = ("cpu", "cuda")


# -- the explicit plans: every window shape for N = 1 to 4 ---------------------------------------------------------


AMP007_VARIES: dict[str, tuple[str, ...]] = {
    "window": (
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
        "open while another optimizer steps",
        "open across a scale change",
    ),
    "make_optimizer_step": ("True", "False", "None"),
    "position": ("inside batch()",),
    "wrappers": ("1", "2"),
    "param_groups": ("2 with other hyper-parameters",),
    "optimizer": ("SGD momentum", "Adam"),
    "call_form": ("closure, wrapper.backward", "backward, then step()"),
    "loss_scale": ("backed off", "grown", "settings given to the factory"),
}


@pytest.mark.requirement("AMP-007", "ACC-001", "AMP-004", "AMP-006", "STEP-004")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("accumulate", [1, 2, 3, 4])
@pytest.mark.varies(**(AMP007_VARIES | {"wrappers": ("2",)}))
def test_windows_near_the_float16_range_follow_the_recipe(
    make_context: MakeContext, cell: Cell, accumulate: int
) -> None:
    """Windows of 1 to 4 near float16's range: applied, skipped and scaled as ``scaler.scale(loss / N)`` makes them.

    One explicit plan per ``N`` (see :func:`.edge_plans.explicit_plan`): every window shape, two wrappers with two
    parameter groups each (SGD with momentum, Adam), both call forms, a back-off and growth. After every call the
    outcome and the factors the backward passes propagated are the recipe's; after every batch, the parameters.
    """
    run_edge_plan(make_context, cell, explicit_plan(accumulate))


# -- generated plans --------------------------------------------------------------------------------------------


GENERATED_PLANS = 25
"""Generated plans per eager cell in a plain run (``--property-examples=N`` runs ``N``)."""


@pytest.mark.requirement("AMP-007", "ACC-001", "AMP-004", "AMP-006", "STEP-004")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.varies(**AMP007_VARIES)
def test_generated_windows_near_the_float16_range(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest
) -> None:
    """Generated plans: ``N`` of 1 to 4, one or two wrappers, any flags, heights, forms, scale growth and back-off."""
    if HYPOTHESIS_MISSING is not None:
        unavailable(HYPOTHESIS_MISSING)
    requested = request.config.getoption("property_examples", default=None)
    # derandomize seeds the draws with generated()'s source (comments and decorators aside): its text, the name it
    # calls included, fixes which plans run, so it keeps the name it had before the plans moved to edge_plans.py.
    _run_edge_plan = run_edge_plan

    @settings(
        max_examples=int(requested) if requested else GENERATED_PLANS,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,) + ((Phase.shrink,) if requested else ()),
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(plan=st.composite(draw_plan)())
    def generated(plan: EdgePlan) -> None:
        _run_edge_plan(make_context, cell, plan)

    generated()


# -- AMP-008: a closure's backward that missed the wrapper ----------------------------------------------------------


UNSCALED_FORMS: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], None]] = {
    "loss.backward()": lambda wrapper, loss, other: loss.backward(),
    "torch.autograd.backward": lambda wrapper, loss, other: torch.autograd.backward([loss]),
    "wrapper.backward, then loss.backward()": lambda wrapper, loss, other: (
        wrapper.backward(other),
        loss.backward(),
    )[0],
    "loss.backward(), then wrapper.backward": lambda wrapper, loss, other: (
        loss.backward(),
        wrapper.backward(other),
    )[0],
}
"""What a closure runs instead of (or besides) a wrapper's backward of its loss."""


def _retry_recipe(base: Parts, cell: Cell, inputs: list[torch.Tensor], *, discard: bool, closing: bool) -> Parts:
    """The recipe of the refused-call check on a copy of ``base``, as :class:`PlainWindows` with a default scaler.

    A's windows {0, 1}, {2} (``closing``) or {0, 1, 2}, without batch 0 under ``discard``; B's {0, 2}.
    """
    recipe = oracle_copy(base, cell)
    assert isinstance(recipe, Parts)
    scaler = GradScaler(cell_device(cell).type)
    loop = PlainWindows(cell, [part_optimizer(recipe, index) for index in range(2)], scaler, 3)
    first = ((1, False),) if discard else ((0, False), (1, False))
    for batch, calls in enumerate((first, ((0, closing),), ((0, True), (1, True)))):
        for index, closes in calls:
            loop.backward(index, loss_under(oracle_autocast(cell), recipe, index, inputs[batch]))
            if closes:
                loop.step(index)
        loop.update()
    return recipe


def _assert_left_by_the_refused_call(
    context: TrainingContext,
    wrappers: tuple[Any, Any],
    params: Sequence[torch.Tensor],
    before: tuple[list[torch.Tensor | None], list[torch.Tensor], StepOutcome | None, object],
    error: BaseException,
    discard: bool,
    what: str,
) -> None:
    """What a refused call of ``wrappers[0]`` leaves: its window as before (gone under ``discard``), all else as before.

    ``before``: the gradients and values of ``params``, the outcome and the context's state (``None``: not taken).
    """
    (wrapper, other), (held, values, outcome, state) = wrappers, before
    own = [p for group in wrapper.param_groups for p in group["params"]]
    gone = [discard and any(param is p for p in own) for param in params]  # the discarded window (FAIL-003)
    want = [None if discarded else grad for discarded, grad in zip(gone, held, strict=True)]
    assert_same_grads(grads(params), want, f"{what} (CLOS-003: the window as before the call)")
    assert_same_values(param_values(params), values, what)
    if discard:
        assert wrapper.last_outcome is StepOutcome.DISCARDED, f"{what}: last_outcome is {wrapper.last_outcome}"
        assert_discard_note(error, wrapper.optimizer, (1, 2), what)
    else:
        assert wrapper.last_outcome is outcome, f"{what}: last_outcome became {wrapper.last_outcome}"
    assert other.last_outcome is StepOutcome.ACCUMULATED, f"{what}: the other wrapper's outcome changed"
    if state is not None:
        assert_same_state(context.state_dict(), state, f"{what}, context.state_dict()")


@pytest.mark.requirement("AMP-008", "CLOS-003", "AMP-007", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("closing", [False, True], ids=["accumulating", "closing"])
@pytest.mark.parametrize("unscaled", list(UNSCALED_FORMS))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    call_form=("closure, loss.backward",),
    faults=("invalid argument", "raising closure after its backward"),
    make_optimizer_step=("True", "False"),
    window=("k >= 2 micro-steps",),
    wrappers=("2",),
    on_failure=("discard", "restore"),
)
def test_unscaled_backward_in_a_closure_is_refused(
    make_context: MakeContext,
    cell: Cell,
    implementation: ImplementationInfo[Any],
    unscaled: str,
    closing: bool,
    on_failure: str,
) -> None:
    """A 16-mixed closure whose backward missed the wrapper's scaling is refused; the call fails as a raising closure.

    The window holds one micro-step already, and the refused call's backward wrote into it. Under ``"restore"`` the
    call leaves its gradients, the parameters, the outcome and (where checkpointing is claimed) the context's state
    as they were; under ``"discard"`` the window is gone (every gradient ``None``, ``DISCARDED``, a note on the
    exception) and the parameters as they were. The corrected retry then gives the recipe's result over the windows
    each policy leaves. The other wrapper's open window is untouched throughout.
    """
    discard = on_failure == "discard"
    context = make_context(accumulate_grad_batches=3, **failure_settings(on_failure))
    base = Parts(2)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, Parts)
    wrapper, other = (context.wrap(part_optimizer(model, index)) for index in range(2))
    inputs = [x.to(cell_device(cell)) for x in edge_inputs(3)]

    def good(index: int, x: torch.Tensor) -> Callable[[], None]:
        target = (wrapper, other)[index]
        return lambda: target.backward(loss_under(context.autocast(), model, index, x))

    with context.batch(0):
        wrapper.step(good(0, inputs[0]), make_optimizer_step=False)
        other.step(good(1, inputs[0]), make_optimizer_step=False)
    params = list(model.parameters())
    checkpointing = "checkpointing" in implementation.features
    state = copy.deepcopy(context.state_dict()) if checkpointing and not discard else None
    before = (grads(params), param_values(params), wrapper.last_outcome, state)

    def bad() -> None:
        loss, other_loss = (loss_under(context.autocast(), model, 0, inputs[1]) for _ in range(2))
        UNSCALED_FORMS[unscaled](wrapper, loss, other_loss)

    with context.batch(1):
        with refuses(
            RuntimeError,
            f"a 16-mixed step() ({'closing' if closing else 'accumulating'}) whose closure ran {unscaled}",
            "AMP-008: a closure's backward that did not go through a wrapper's backward is refused, naming "
            "opt.backward(loss)",
            match=r"opt\.backward\(loss\)",
        ) as raised:
            wrapper.step(bad, make_optimizer_step=closing)
        what = f"a refused step() whose closure ran {unscaled} (on_failure={on_failure!r})"
        _assert_left_by_the_refused_call(context, (wrapper, other), params, before, raised.value, discard, what)
        wrapper.step(good(0, inputs[1]), make_optimizer_step=closing)
    with context.batch(2, is_last=True):
        wrapper.step(good(0, inputs[2]), make_optimizer_step=True)
        other.step(good(1, inputs[2]), make_optimizer_step=True)

    recipe = _retry_recipe(base, cell, inputs, discard=discard, closing=closing)
    assert_params_close(model, recipe, cell, f"after the refused call ({unscaled}) and its corrected retry")


PENALTY_SCALER = GradScalerSettings(init_scale=2.0**8)
"""A scale at which the penalties' double backward stays finite in float16."""


@pytest.mark.requirement("AMP-008", "AMP-007")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("of", ["inputs", "parameters"])
@pytest.mark.varies(call_form=("closure, wrapper.backward",), backward_args=("create_graph", "inputs"))
def test_a_gradient_penalty_through_autograd_grad_is_not_refused(
    make_context: MakeContext, cell: Cell, of: str
) -> None:
    """A closure that takes ``torch.autograd.grad`` (a gradient penalty), then ``wrapper.backward``, is accepted.

    The penalty is on the gradient with respect to the inputs (WGAN-GP) or to the parameters (a gradient-norm
    regulariser, whose ``torch.autograd.grad`` computes the very gradients the window holds). Neither writes a
    ``.grad``: only what reaches the gradients is told apart. The result is the recipe's: the penalty's gradient
    scaled with the loss.
    """
    context = make_context(accumulate_grad_batches=2, grad_scaler=PENALTY_SCALER)
    base = Parts(1)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, Parts)
    wrapper = context.wrap(part_optimizer(model, 0))
    inputs = [x.to(cell_device(cell)) for x in edge_inputs(2)]

    def penalised(module: Parts, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(of == "inputs")
        loss = loss_under(nullcontext(), module, 0, x)
        wrt = [x] if of == "inputs" else list(module.parameters())
        gradients = torch.autograd.grad(loss, wrt, create_graph=True)
        return loss + sum((grad.pow(2).sum() for grad in gradients), torch.zeros((), device=x.device))

    for batch_idx, x in enumerate(inputs):
        with context.batch(batch_idx, is_last=batch_idx == 1):

            def closure(x: torch.Tensor = x) -> None:
                with context.autocast():
                    loss = penalised(model, x)
                wrapper.backward(loss)

            wrapper.step(closure)
    assert wrapper.last_outcome is S, (
        f"the window of two with a gradient penalty on the {of} closed as {wrapper.last_outcome}"
    )
    recipe = oracle_copy(base, cell)
    assert isinstance(recipe, Parts)
    loop = PlainWindows(
        cell, [part_optimizer(recipe, 0)], GradScaler(cell_device(cell).type, **PENALTY_SCALER.as_kwargs()), 2
    )
    for x in inputs:
        with oracle_autocast(cell):
            loss = penalised(recipe, x)
        loop.backward(0, loss)
    loop.step(0)
    loop.update()
    assert_params_close(model, recipe, cell, f"a window of two whose closures took a gradient penalty on the {of}")


@pytest.mark.requirement("CKPT-003", "AMP-007")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(copies=("checkpoint",), faults=("refused load",), window=("k >= 2 micro-steps", "1 micro-step"))
def test_open_window_state_of_another_divisor_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """A state taken with a window open under ``accumulate_grad_batches=2`` does not load where it is 3.

    Its gradients carry the loss divisor 2 (AMP-007); the context refuses it with ``ValueError`` and changes nothing.
    The same state loads where it is 2, and a state with every window closed loads anywhere.
    """

    def build(accumulate: int) -> tuple[TrainingContext, Parts, Any]:
        context = make_context(accumulate_grad_batches=accumulate)
        model = context.prepare_module(Parts(1))
        assert isinstance(model, Parts)
        return context, model, context.wrap(part_optimizer(model, 0))

    context, model, wrapper = build(2)
    x = edge_inputs(1)[0].to(cell_device(cell))
    with context.batch(0):
        wrapper.step(lambda: wrapper.backward(loss_under(context.autocast(), model, 0, x)), make_optimizer_step=False)
    open_state = copy.deepcopy(context.state_dict())
    other, other_model, other_wrapper = build(3)
    with other.batch(0):
        other_wrapper.step(
            lambda: other_wrapper.backward(loss_under(other.autocast(), other_model, 0, x)), make_optimizer_step=True
        )
    before = copy.deepcopy(other.state_dict())
    held = grads(other_model.parameters())
    with refuses(
        ValueError,
        "load_state_dict of a 16-mixed state with a window open under accumulate_grad_batches=2, where it is 3",
        "CKPT-003, AMP-007: the open window's gradients carry another loss divisor; refused before anything changes",
    ):
        other.load_state_dict(open_state)
    assert_same_state(other.state_dict(), before, "after the refused load, context.state_dict()")
    assert_same_grads(grads(other_model.parameters()), held, "the refused load changed gradients")
    same, _, _ = build(2)
    same.load_state_dict(open_state)
    closed = copy.deepcopy(before)
    fresh, _, _ = build(3)
    fresh.load_state_dict(closed)
    anywhere, _, _ = build(4)
    anywhere.load_state_dict(closed)
