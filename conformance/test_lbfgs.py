"""Checks of optimizers that evaluate the closure themselves (LBFGS), rule by rule, against a plain LBFGS.

LBFGS calls the closure as often as it needs on a real step. Every rule that applies to a step applies to each of
those evaluations: toggling, clipping, and on failure the roll-back of parameters, gradients and LBFGS's state.
Each oracle here is a bare ``torch.optim.LBFGS`` stepped with a closure that does by hand what the rule says
(toggles the other optimizer's parameters off, clips right after its backward).

LBFGS's data-dependent loop recompiles on every evaluation under XLA (minutes per cell): eager devices only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    assert_same_grads,
    grads,
    last_outcome,
    param_values,
    requires_grad_flags,
    state_diff,
)
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    REORDERED_TOLERANCES,
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
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED
LBFGS_CELLS = pytest.mark.cells(devices=("cpu", "cuda"), precisions=("64-true", "32-true"))
LBFGS_HYPER: dict[str, Any] = {"lr": 0.5, "max_iter": 4, "line_search_fn": "strong_wolfe"}
"""With a line search LBFGS converges here, clipped or not: a last-bit difference of a valid implementation (a
norm summed in another order) stays far inside the tolerance, which it would not if the steps diverged."""
"""Four iterations per step: five evaluations of the closure, and parameters that move between them."""
SGD_LR = 0.1


class _Pair:
    """A context with LBFGS on ``model.a`` and SGD on ``model.b``, and the plain-PyTorch oracle of both."""

    def __init__(
        self, make_context: MakeContext, cell: Cell, clip: Callable[[Any], object] | None = None, **context_kwargs: Any
    ) -> None:
        self.cell = cell
        self.device, self.dtype = cell_device(cell), cell_dtype(cell)
        self.context = make_context(**context_kwargs)
        base = Halves(31, 32)
        oracle = oracle_copy(base, cell)
        model = self.context.prepare_module(base)
        assert isinstance(model, Halves) and isinstance(oracle, Halves)
        self.model, self.oracle = model, oracle
        self.lbfgs = self.context.wrap(torch.optim.LBFGS(model.a.parameters(), **LBFGS_HYPER))
        self.sgd = self.context.wrap(torch.optim.SGD(model.b.parameters(), lr=SGD_LR))
        self.oracle_lbfgs = torch.optim.LBFGS(oracle.a.parameters(), **LBFGS_HYPER)
        self.oracle_sgd = torch.optim.SGD(oracle.b.parameters(), lr=SGD_LR)
        self.clip: Callable[[Any], object] = clip or (lambda params: None)
        """What the oracle does to its gradients right after each backward (the context's clipping)."""
        self.evaluations: list[dict[str, bool]] = []
        """The ``requires_grad`` flags seen at the start of each evaluation of the wrapper's LBFGS closure."""

    def loss(self, model: Halves, batch: Batch) -> torch.Tensor:
        """Both halves' loss: LBFGS sees ``b``'s term too, which must not reach ``b``'s gradients."""
        return mse(model.a, batch, self.device, self.dtype) + mse(model.b, batch, self.device, self.dtype)

    def closure(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """The LBFGS closure for the wrapper: zero, forward, ``w.backward``, return the loss."""

        def closure() -> torch.Tensor:
            self.evaluations.append(requires_grad_flags(self.model))
            self.lbfgs.zero_grad()
            loss = self.loss(self.model, batch)
            self.lbfgs.backward(loss)
            return loss

        return closure

    def oracle_closure(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """The same closure for the bare LBFGS: ``b`` toggled off by hand, clipped right after the backward."""

        def closure() -> torch.Tensor:
            self.oracle_lbfgs.zero_grad()
            with _frozen(list(self.oracle.b.parameters())):
                loss = self.loss(self.oracle, batch)
                loss.backward()
            self.clip(list(self.oracle.a.parameters()))
            return loss

        return closure

    def lbfgs_step(self, batch: Batch, make_optimizer_step: bool | None = None) -> None:
        """One LBFGS step of the wrapper and of the oracle; both return the same loss."""
        start = len(self.evaluations)
        got = self.lbfgs.step(self.closure(batch), make_optimizer_step=make_optimizer_step)
        want = self.oracle_lbfgs.step(self.oracle_closure(batch))
        tol = REORDERED_TOLERANCES[self.cell.precision]
        torch.testing.assert_close(
            got, want, rtol=tol.rtol, atol=tol.atol, msg="step must return what LBFGS's own step returns"
        )
        assert len(self.evaluations) - start > 1, "LBFGS was not allowed to evaluate the closure several times"

    def sgd_closure(self, batch: Batch) -> Callable[[], None]:
        """The SGD wrapper's closure on ``b``."""

        def closure() -> None:
            self.sgd.backward(mse(self.model.b, batch, self.device, self.dtype))

        return closure

    def oracle_sgd_window(self, batches: list[Batch]) -> None:
        """The bare SGD's step on the mean of ``batches``' gradients of ``b``, clipped as the context clips."""
        self.oracle_sgd.zero_grad()
        for batch in batches:
            mse(self.oracle.b, batch, self.device, self.dtype).backward()
        with torch.no_grad():
            for param in self.oracle.b.parameters():
                assert param.grad is not None
                param.grad /= len(batches)
        self.clip(list(self.oracle.b.parameters()))
        self.oracle_sgd.step()
        self.oracle_sgd.zero_grad()

    def assert_toggled(self, what: str) -> None:
        """Every evaluation so far saw only ``a`` requiring grad; every flag is back to ``True`` now."""
        for index, seen in enumerate(self.evaluations):
            wrong = {name: flag for name, flag in seen.items() if flag != name.startswith("a.")}
            assert not wrong, (
                f"{what}: in LBFGS evaluation {index} these flags were wrong (LBFGS's own parameters a.* must "
                f"require grad, the SGD wrapper's b.* must not): {wrong}"
            )
        after = requires_grad_flags(self.model)
        assert all(after.values()), f"{what}: flags not restored after the step: {after}"


@contextmanager
def _frozen(params: list[torch.Tensor]) -> Iterator[None]:
    for param in params:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param in params:
            param.requires_grad_(True)


def _alongside_sgd(
    make_context: MakeContext, cell: Cell, clip: Callable[[Any], object] | None = None, **context_kwargs: Any
) -> None:
    """LBFGS steps twice, first while the SGD wrapper's window is open; each step checked against the oracle."""
    pair = _Pair(make_context, cell, clip, **context_kwargs)
    batches = make_batches(4, seed=5)
    pair.sgd.step(pair.sgd_closure(batches[0]), make_optimizer_step=False)
    sgd_window = grads(pair.model.b.parameters())
    sgd_params = param_values(pair.model.b.parameters())
    assert last_outcome(pair.lbfgs) is None, f"LBFGS's last_outcome is {last_outcome(pair.lbfgs)} before its first step"

    for step, (batch, make_step) in enumerate(((batches[1], None), (batches[3], True))):
        pair.lbfgs_step(batch, make_step)
        what = f"LBFGS step {step} (make_optimizer_step={make_step})"
        pair.assert_toggled(what)
        assert pair.lbfgs.last_outcome is S, f"{what}: LBFGS's last_outcome is {pair.lbfgs.last_outcome}"
        assert all(p.grad is None for p in pair.model.a.parameters()), f"{what}: LBFGS's gradients are not None"
        if step == 0:
            assert pair.sgd.last_outcome is A, (
                f"{what} changed the SGD wrapper's last_outcome to {pair.sgd.last_outcome}"
            )
            assert_same_grads(
                grads(pair.model.b.parameters()),
                sgd_window,
                f"{what} changed the gradients of the SGD wrapper's open window",
            )
            assert all(torch.equal(p, q) for p, q in zip(pair.model.b.parameters(), sgd_params, strict=True)), (
                f"{what} changed the SGD wrapper's parameters"
            )
            pair.sgd.step(pair.sgd_closure(batches[2]), make_optimizer_step=True)
            pair.oracle_sgd_window([batches[0], batches[2]])
            assert pair.sgd.last_outcome is S, f"the SGD wrapper's window did not step: {pair.sgd.last_outcome}"
            assert pair.lbfgs.last_outcome is S, (
                f"the SGD wrapper's step changed LBFGS's last_outcome to {pair.lbfgs.last_outcome}"
            )
    assert pair.sgd.last_outcome is S, f"LBFGS's step changed the SGD wrapper's last_outcome to {pair.sgd.last_outcome}"
    assert_params_close(
        pair.model, pair.oracle, cell, "two LBFGS steps beside an SGD window", REORDERED_TOLERANCES[cell.precision]
    )


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

    def clip(params: Any) -> object:
        if algorithm == "norm":
            return torch.nn.utils.clip_grad_norm_(params, value)
        return torch.nn.utils.clip_grad_value_(params, value)

    _alongside_sgd(make_context, cell, clip, gradient_clip_val=value, gradient_clip_algorithm=algorithm)


class _Boom(RuntimeError):
    """The error a failing closure raises."""


def _failing_closure(
    pair: _Pair, batch: Batch, at: int | None, seen: list[list[torch.Tensor]]
) -> Callable[[], torch.Tensor | None]:
    """Raises after the backward of evaluation ``at``; with ``at=None`` every evaluation returns ``None``.

    Each evaluation appends LBFGS's parameters as it begins to ``seen`` (cleared here).
    """
    evaluate = pair.closure(batch)
    seen.clear()

    def closure() -> torch.Tensor | None:
        seen.append(param_values(pair.model.a.parameters()))
        loss = evaluate()
        if at is None:
            return None
        if len(seen) == at:
            raise _Boom(f"evaluation {at} failed")
        return loss

    return closure


def _failed_lbfgs_step(pair: _Pair, closure: Callable[[], torch.Tensor | None], at: int | None, what: str) -> str:
    """The LBFGS wrapper's step with a failing ``closure``, which must raise; returns the step's description."""
    if at is None:
        try:
            pair.lbfgs.step(closure)
        except Exception:  # LBFGS's own float(None), or the wrapper's check: either is a failed step
            pass
        else:
            raise AssertionError("an LBFGS step whose closure returned None did not raise")
        return "an LBFGS step whose closure returned None"
    with refuses(
        _Boom,
        f"the LBFGS wrapper's step(closure) whose closure {what}",
        "CLOS-003: the exception of a closure that raises in any evaluation propagates out of step()",
    ):
        pair.lbfgs.step(closure)
    return f"an LBFGS step whose closure {what}"


@dataclass(frozen=True)
class _Before:
    """What a failed LBFGS step must leave as it was: parameters, gradients, LBFGS's state dict, flags."""

    values: list[torch.Tensor]
    held: list[torch.Tensor | None]
    state: dict[str, Any]
    flags: dict[str, bool]

    @classmethod
    def take(cls, pair: _Pair) -> _Before:
        model = pair.model
        state = copy.deepcopy(pair.lbfgs.optimizer.state_dict())
        return cls(param_values(model.parameters()), grads(model.parameters()), state, requires_grad_flags(model))

    def assert_unchanged(self, pair: _Pair, what: str) -> None:
        """Every parameter, gradient (LBFGS's and the open SGD window's), LBFGS's state and every flag as taken."""
        model = pair.model
        for (name, param), value in zip(model.named_parameters(), self.values, strict=True):
            assert torch.equal(param.detach(), value), f"after {what}: parameter {name!r} changed"
        for (name, param), grad in zip(model.named_parameters(), self.held, strict=True):
            assert_same_grads(
                grads([param]),
                [grad],
                f"after {what}: the gradient of {name!r} is not what it was before the call "
                f"({'LBFGS' if name.startswith('a.') else 'the open SGD window'})",
            )
        assert state_diff(pair.lbfgs.optimizer.state_dict(), self.state) is None, (
            f"after {what}: LBFGS's state dict changed"
        )
        assert requires_grad_flags(model) == self.flags, (
            f"after {what}: flags {requires_grad_flags(model)}, before the call {self.flags}"
        )


@pytest.mark.requirement("CLOS-003", "TOGGLE-002", "FAIL-005", "FAIL-002")
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
    pair = _Pair(make_context, cell, **failure_settings(on_failure))
    model = pair.model
    batches = make_batches(3, seed=7)
    pair.lbfgs_step(batches[0])  # LBFGS has a history now, which a failed step must not extend
    pair.sgd.step(pair.sgd_closure(batches[1]), make_optimizer_step=False)
    pair.lbfgs.backward(mse(model.a, batches[2], pair.device, pair.dtype))  # gradients left from outside a step
    before = _Before.take(pair)
    seen: list[list[torch.Tensor]] = []
    for at, what in ((1, "raised in its first evaluation"), (3, "raised in its third evaluation"), (None, "None")):
        what = _failed_lbfgs_step(pair, _failing_closure(pair, batches[1], at, seen), at, what)
        if at == 3:
            assert len(seen) == 3 and any(not torch.equal(p, q) for p, q in zip(seen[2], seen[0], strict=True)), (
                "check precondition: LBFGS did not move the parameters before the third evaluation"
            )
        before.assert_unchanged(pair, what)
    pair.evaluations.clear()
    pair.lbfgs_step(batches[2])
    pair.assert_toggled("the retry after the failed steps")
    pair.sgd.step(pair.sgd_closure(batches[0]), make_optimizer_step=True)
    pair.oracle_sgd_window([batches[1], batches[0]])
    assert_params_close(
        model,
        pair.oracle,
        cell,
        "the retry after failed LBFGS steps, and the SGD window",
        REORDERED_TOLERANCES[cell.precision],
    )


def _lbfgs_pair(
    make_context: MakeContext, cell: Cell, hyper: dict[str, Any]
) -> tuple[torch.nn.Module, torch.nn.Module, Any, torch.optim.LBFGS]:
    """A prepared model with a wrapped LBFGS, and the oracle's copy of it with a bare LBFGS of the same settings."""
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper: Any = context.wrap(torch.optim.LBFGS(model.parameters(), **hyper))
    return model, oracle, wrapper, torch.optim.LBFGS(oracle.parameters(), **hyper)


@dataclass
class _Lone:
    """A context with one wrapped LBFGS over a whole model, a bare LBFGS on a copy, and their closures on a batch."""

    model: torch.nn.Module
    oracle: torch.nn.Module
    wrapper: Any
    oracle_opt: torch.optim.LBFGS
    closure: Callable[[], torch.Tensor]
    """The wrapper's closure: zero, forward, ``w.backward``, the loss; each evaluation appends to ``evaluations``."""
    oracle_closure: Callable[[], torch.Tensor]
    evaluations: list[int]

    @classmethod
    def build(cls, make_context: MakeContext, cell: Cell, batch: Batch, **hyper: Any) -> _Lone:
        model, oracle, wrapper, oracle_opt = _lbfgs_pair(make_context, cell, hyper)
        device, dtype = cell_device(cell), cell_dtype(cell)
        evaluations: list[int] = []

        def closure() -> torch.Tensor:
            evaluations.append(1)
            wrapper.zero_grad()
            loss = mse(model, batch, device, dtype)
            wrapper.backward(loss)
            return loss

        def oracle_closure() -> torch.Tensor:
            oracle_opt.zero_grad()
            loss = mse(oracle, batch, device, dtype)
            loss.backward()
            return loss

        return cls(model, oracle, wrapper, oracle_opt, closure, oracle_closure, evaluations)


@pytest.mark.requirement("CLOS-002")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(make_optimizer_step=("False", "None", "True"), optimizer=("LBFGS",))
def test_lbfgs_refuses_to_accumulate(make_context: MakeContext, cell: Cell) -> None:
    """``make_optimizer_step=False``, and ``accumulate_grad_batches=2``: ``ValueError`` before the closure runs."""
    batch = make_batches(1, seed=9)[0]
    lone = _Lone.build(make_context, cell, batch, **LBFGS_HYPER)
    model, oracle, wrapper = lone.model, lone.oracle, lone.wrapper
    device, dtype = cell_device(cell), cell_dtype(cell)
    calls: list[int] = []

    def refused() -> torch.Tensor:
        calls.append(1)
        loss = mse(model, batch, device, dtype)
        wrapper.backward(loss)
        return loss

    for make_step in (None, True):  # refused before the first step (no state yet) and after one (a history)
        values, state = param_values(model.parameters()), copy.deepcopy(wrapper.optimizer.state_dict())
        try:
            wrapper.step(refused, make_optimizer_step=False)
        except ValueError:
            pass
        else:
            raise AssertionError(
                f"LBFGS's step(make_optimizer_step=False) was accepted (outcome {last_outcome(wrapper)}); expected a "
                f"ValueError before the closure runs (it ran {len(calls)} times)"
            )
        assert calls == [], "the closure ran before LBFGS with make_optimizer_step=False was refused"
        assert all(torch.equal(p, v) for p, v in zip(model.parameters(), values, strict=True)), (
            "a refused step(make_optimizer_step=False) changed a parameter"
        )
        assert all(p.grad is None for p in model.parameters()), "a refused step left gradients"
        assert state_diff(wrapper.optimizer.state_dict(), state) is None, "a refused step changed LBFGS's state"
        wrapper.step(lone.closure, make_optimizer_step=make_step)
        lone.oracle_opt.step(lone.oracle_closure)
        assert wrapper.last_outcome is S, f"step(make_optimizer_step={make_step}): {wrapper.last_outcome}"
    assert_params_close(
        model, oracle, cell, "two LBFGS steps after refused accumulating steps", REORDERED_TOLERANCES[cell.precision]
    )

    accumulating = make_context(accumulate_grad_batches=2)
    lbfgs_model = accumulating.prepare_module(make_model())
    try:
        accumulating.wrap(torch.optim.LBFGS(lbfgs_model.parameters())).step(refused)
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
    lone = _Lone.build(make_context, cell, batch, **LBFGS_HYPER)
    model, oracle, wrapper, closure, calls = lone.model, lone.oracle, lone.wrapper, lone.closure, lone.evaluations
    inner_steps: list[int] = []
    wrapper.optimizer.register_step_pre_hook(lambda *args: inner_steps.append(1))
    device, dtype = cell_device(cell), cell_dtype(cell)

    wrapper.step(closure)
    lone.oracle_opt.step(lone.oracle_closure)
    wrapper.backward(mse(model, batch, device, dtype))  # gradients left from outside a step
    values, held = param_values(model.parameters()), grads(model.parameters())
    state = copy.deepcopy(wrapper.optimizer.state_dict())
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
        assert all(torch.equal(p, v) for p, v in zip(model.parameters(), values, strict=True)), (
            f"step({what}) changed a parameter"
        )
        assert_same_grads(grads(model.parameters()), held, f"step({what}) changed a gradient")
        assert state_diff(wrapper.optimizer.state_dict(), state) is None, f"step({what}) changed LBFGS's state"
    wrapper.step(closure)
    lone.oracle_opt.step(lone.oracle_closure)
    assert_params_close(
        model, oracle, cell, "an LBFGS step after refused arguments", REORDERED_TOLERANCES[cell.precision]
    )


@pytest.mark.requirement("CLOS-002", "STEP-006")
@pytest.mark.features("closure_evaluating_optimizers")
@LBFGS_CELLS
@pytest.mark.varies(optimizer=("LBFGS",), wrappers=("1",))
def test_lbfgs_evaluates_the_closure_itself(make_context: MakeContext, cell: Cell) -> None:
    """LBFGS steps as a bare LBFGS does with the same closure, and returns what LBFGS returns."""
    lone = _Lone.build(make_context, cell, make_batches(1)[0], lr=0.5, max_iter=5)
    model, oracle, evaluations = lone.model, lone.oracle, lone.evaluations
    for _ in range(2):
        got = lone.wrapper.step(lone.closure)
        want = lone.oracle_opt.step(lone.oracle_closure)
        tol = REORDERED_TOLERANCES[cell.precision]
        torch.testing.assert_close(
            got, want, rtol=tol.rtol, atol=tol.atol, msg="step must return what LBFGS's own step returns"
        )
    assert len(evaluations) > 2, "LBFGS was not allowed to evaluate the closure several times"
    assert_params_close(model, oracle, cell, "two LBFGS steps", REORDERED_TOLERANCES[cell.precision])
    lbfgs_context = make_context(accumulate_grad_batches=2)
    lbfgs_model = lbfgs_context.prepare_module(make_model())
    lbfgs = torch.optim.LBFGS(lbfgs_model.parameters())
    with refuses(
        ValueError,
        "wrap(LBFGS) in a context with accumulate_grad_batches=2, then its step(closure)",
        "CLOS-002: an LBFGS cannot accumulate, so wrap refuses it when accumulate_grad_batches > 1",
    ):
        lbfgs_context.wrap(lbfgs).step(lone.closure)


_EVALUATION_CASES: tuple[tuple[int, int, str | None, str], ...] = (
    # max_iter, history_size, line_search_fn, the backward the closure calls
    (1, 100, None, "wrapper"),
    (3, 2, None, "loss"),
    (5, 3, "strong_wolfe", "wrapper"),
    (5, 100, None, "loss"),
)
"""One evaluation per step (max_iter=1: only a stale gradient can leak in), then several, with a short history
(the curvature pairs of earlier steps dropped) and a line search (evaluations at trial points)."""


def _lbfgs_evaluations_case(
    make_context: MakeContext, cell: Cell, zeroing: str, hyper: dict[str, Any], backward: str
) -> None:
    """Three LBFGS steps of the wrapper and of a bare LBFGS, a stale gradient left on the parameters before each."""
    device, dtype = cell_device(cell), cell_dtype(cell)
    tol = REORDERED_TOLERANCES[cell.precision]
    case = f"LBFGS({hyper}), closure with {backward}.backward and zeroing {zeroing!r}"
    model, oracle, wrapper, oracle_opt = _lbfgs_pair(make_context, cell, hyper)
    stale = make_batches(1, seed=12)[0]
    seen: list[list[str]] = []
    """For each evaluation of the wrapper's closure, the parameters that had a gradient when it began."""
    oracle_evaluations: list[int] = []

    def closure(batch: Batch) -> torch.Tensor:
        seen.append([name for name, param in model.named_parameters() if param.grad is not None])
        if zeroing != "none":
            wrapper.zero_grad(set_to_none=zeroing == "set_to_none")
        loss = mse(model, batch, device, dtype)
        if backward == "wrapper":
            wrapper.backward(loss)
        else:
            loss.backward()
        return loss

    def oracle_closure(batch: Batch) -> torch.Tensor:
        oracle_evaluations.append(1)
        oracle_opt.zero_grad()
        loss = mse(oracle, batch, device, dtype)
        loss.backward()
        return loss

    for step, batch in enumerate(make_batches(3, seed=11)):
        seen.clear()
        oracle_evaluations.clear()
        mse(model, stale, device, dtype).backward()  # a stale gradient, left from outside any step
        assert all(p.grad is not None for p in model.parameters()), "check precondition: no stale gradient"
        got = wrapper.step(lambda batch=batch: closure(batch))
        want = oracle_opt.step(lambda batch=batch: oracle_closure(batch))
        what = f"{case}, step {step}"
        with_grads = [(index, names) for index, names in enumerate(seen) if names]
        assert not with_grads, (
            f"{what}: LBFGS evaluations began with gradients on the parameters (evaluation, parameters): "
            f"{with_grads}; each evaluation must begin from None, the stale gradient and the previous "
            "evaluation's gone"
        )
        assert len(seen) == len(oracle_evaluations), (
            f"{what}: LBFGS evaluated the closure {len(seen)} times, the bare LBFGS {len(oracle_evaluations)} times"
        )
        torch.testing.assert_close(
            got, want, rtol=tol.rtol, atol=tol.atol, msg=f"{what}: step must return what LBFGS's own step returns"
        )
        assert_params_close(model, oracle, cell, what, tol)


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
        _lbfgs_evaluations_case(make_context, cell, zeroing, hyper, backward)
