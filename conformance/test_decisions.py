"""Checks of the readings that ``docs/decisions.md`` entries 20 to 33 decided, each failing the other reading.

The contract's text left these questions open, and an implementation written from it could read them either way.
Each check here passes the reading the contract chose and fails the other one; the broken implementations in
``tests/mutants`` that take the other reading show it (the ``MUTANTS`` table names them). Expected values come from a
plain-PyTorch loop written beside the check, or are worked by hand.
"""

from __future__ import annotations

import copy
import gc
import pickle
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    Batch,
    Halves,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import WindowOracle, oracle_copy
from lightning_optimizer.spec import Cell, GradScalerSettings, OptimizerWrapper, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
MIXED = ("16-mixed", "bf16-mixed")
NOT_16 = ("64-true", "32-true", "bf16-mixed", "bf16-true")
UNSET: Any = object()
"""What a recording inner ``step`` sees for an argument it was not given."""


def _params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _assert_close(got: torch.nn.Module | list[torch.Tensor], want: torch.nn.Module, cell: Cell, what: str) -> None:
    tol = tolerance_for(cell)
    got_list = list(got.parameters()) if isinstance(got, torch.nn.Module) else got
    for i, (a, b) in enumerate(zip(got_list, want.parameters(), strict=True)):
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
        assert torch.allclose(a64, b64, rtol=tol.rtol, atol=tol.atol), (
            f"{what}: parameter {i} differs from the plain-PyTorch loop on {cell.id} "
            f"(max abs diff {(a64 - b64).abs().max().item():.3g})"
        )


def _closure(
    context: TrainingContext, wrapper: OptimizerWrapper[Any], model: torch.nn.Module, batch: Batch, cell: Cell
) -> Callable[[], torch.Tensor]:
    """The closure form's closure: the forward under the context's autocast, ``wrapper.backward``, the loss."""

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        wrapper.backward(loss)
        return loss

    return closure


# -- REENT-001: a caught refusal (decision 20) -------------------------------------------------------------------


@pytest.mark.requirement("REENT-001")
@pytest.mark.varies(wrappers=("2",), faults=("re-entered step",), make_optimizer_step=("True",))
def test_a_caught_refusal_of_a_reentered_step_lets_the_outer_call_go_on(make_context: MakeContext, cell: Cell) -> None:
    """A closure that catches the refusal of a re-entered ``step()`` goes on: the outer call steps as without it."""
    batch = make_batches(1, seed=3)[0]
    context = make_context()
    base = Halves(5, 6)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    a = context.wrap(torch.optim.SGD(model.a.parameters(), lr=0.1))
    b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=0.1))
    b_before = _params(model.b)
    refused: list[BaseException] = []
    inner = _closure(context, a, model.a, batch, cell)

    def closure() -> torch.Tensor:
        loss = inner()
        try:
            b.step(_closure(context, b, model.b, batch, cell), make_optimizer_step=True)
        except RuntimeError as error:
            refused.append(error)
        return loss

    with context.batch(0, is_last=True):
        a.step(closure, make_optimizer_step=True)
    assert refused, "wrapper b's step() inside wrapper a's running step() was not refused (REENT-001)"
    assert a.last_outcome is StepOutcome.STEPPED, (
        f"the outer call ended {a.last_outcome}: a refusal its closure caught must not fail it (REENT-001)"
    )
    assert b.last_outcome is None, f"the refused call changed wrapper b's last_outcome to {b.last_outcome}"
    WindowOracle(oracle.a, torch.optim.SGD(oracle.a.parameters(), lr=0.1), cell).train_windows([batch], [[0]])
    _assert_close(model.a, oracle.a, cell, "the outer call whose closure caught the refusal")
    for got, want in zip(model.b.parameters(), b_before, strict=True):
        assert torch.equal(got.detach(), want), "the refused step() changed wrapper b's parameters (REENT-001)"


# -- ERR-010: wrapped once while the context lives (decision 21) -------------------------------------------------


@contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@pytest.mark.requirement("ERR-010")
@pytest.mark.cells(precisions=("32-true",))
@pytest.mark.varies(faults=("invalid argument",), wrappers=("1", "2"))
def test_an_optimizer_is_wrapped_once_while_its_context_lives(make_context: MakeContext, cell: Cell) -> None:
    """A second wrap by the same context is refused; a context not yet collected still wraps; a collected one not."""
    batch = make_batches(1, seed=4)[0]
    first = make_context()
    model = first.prepare_module(make_model(seed=7))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = first.wrap(sgd)
    with refuses(ValueError, "a second wrap() of the same optimizer by the same context", "ERR-010: one window each"):
        first.wrap(sgd)
    wrapper.step(_closure(first, wrapper, model, batch, cell), make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED, "the refused second wrap() broke the first wrapper"
    second = make_context()
    alive = weakref.ref(first)
    with _collector_paused():
        del first, wrapper
        if alive() is not None:  # kept by its own reference cycles: still live until collected
            with refuses(ValueError, "wrap() by another context", "ERR-010: a context is live until collected"):
                second.wrap(sgd)
        gc.collect()
    assert alive() is None, "the context outlived every reference the check held (ERR-010: nothing else may keep it)"
    again = second.wrap(sgd)
    again.step(_closure(second, again, model, batch, cell), make_optimizer_step=True)
    assert again.last_outcome is StepOutcome.STEPPED


# -- CLOS-005: a call without a closure, and what takes one (decision 22) ---------------------------------------


class _Recording(torch.optim.SGD):
    """An SGD whose ``step`` records whether it was given a ``closure`` argument."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)
        self.given: list[bool] = []

    def step(self, closure: Any = UNSET) -> Any:
        self.given.append(closure is not UNSET)
        return super().step(None if closure is UNSET else closure)


class _KeywordsOnly(torch.optim.SGD):
    """An SGD whose ``step`` takes only ``**kwargs``: ``step(closure=...)`` binds, so it gets one."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)
        self.results: list[Any] = []

    def step(self, **kwargs: Any) -> Any:  # type: ignore[override]
        closure = kwargs.get("closure")
        self.results.append(None if closure is None else closure())
        return torch.optim.SGD.step(self)


class _NoClosure(torch.optim.SGD):
    """An SGD whose ``step`` takes no argument at all."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)
        self.calls = 0

    def step(self) -> None:  # type: ignore[override]
        self.calls += 1
        torch.optim.SGD.step(self)


@pytest.mark.requirement("CLOS-005", "STEP-006")
@pytest.mark.varies(
    optimizer=("step(closure) recorded",), call_form=("backward, then step()",), make_optimizer_step=("True", "None")
)
def test_a_call_without_a_closure_hands_the_inner_step_none(make_context: MakeContext, cell: Cell) -> None:
    """``backward(); step()``: the inner ``step`` is called without a ``closure`` argument, as ``step()`` is."""
    batches = make_batches(2, seed=5)
    context = make_context()
    base = make_model(seed=8)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    inner = _Recording(model.parameters())
    wrapper = context.wrap(inner)
    taken: list[bool] = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == 1):
            with context.autocast():
                loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
            wrapper.backward(loss)
            assert wrapper.step(make_optimizer_step=None if batch_idx else True) is None, "STEP-006: None"
            taken.append(wrapper.last_outcome is StepOutcome.STEPPED)
    assert inner.given == [False] * sum(taken), (
        f"a step() without a closure handed the inner step a closure argument in {inner.given} (CLOS-005: none, "
        "not closure=None and not a closure of the wrapper's own)"
    )
    WindowOracle(oracle, torch.optim.SGD(oracle.parameters(), lr=0.1), cell).train_windows(batches, [[0], [1]])
    _assert_close(model, oracle, cell, "backward-then-step() calls")


@pytest.mark.requirement("CLOS-005", "STEP-006")
@pytest.mark.cells(precisions=NOT_16)
@pytest.mark.varies(optimizer=("step(closure) recorded",), call_form=("closure, wrapper.backward",))
def test_what_takes_a_closure_is_what_binds_closure(make_context: MakeContext, cell: Cell) -> None:
    """A ``step(**kwargs)`` gets the closure (its first call returns the result); a ``step()`` with none gets none."""
    batch = make_batches(1, seed=6)[0]
    context = make_context()
    model = context.prepare_module(Halves(9, 10))
    assert isinstance(model, Halves)
    keywords, bare = _KeywordsOnly(model.a.parameters()), _NoClosure(model.b.parameters())
    wa, wb = context.wrap(keywords), context.wrap(bare)
    with context.batch(0, is_last=True):
        got = wa.step(_closure(context, wa, model.a, batch, cell), make_optimizer_step=True)
        wb.step(_closure(context, wb, model.b, batch, cell), make_optimizer_step=True)
    assert len(keywords.results) == 1 and keywords.results[0] is got, (
        "an inner step(**kwargs) must get a closure whose first call returns the call's result (CLOS-005)"
    )
    assert bare.calls == 1 and wb.last_outcome is StepOutcome.STEPPED, "an inner step() without parameters must run"


# -- HOOK-005: copies carry no hooks (decision 23) ---------------------------------------------------------------


@pytest.mark.requirement("HOOK-005", "PICKLE-001")
@pytest.mark.features("hooks", "pickling")
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.varies(copies=("pickle", "deepcopy"))
def test_copies_carry_no_hooks(make_context: MakeContext, cell: Cell, how: str) -> None:
    """A copy of a context with (unpicklable) hooks works, calls none of them; the original keeps its hooks."""
    batch = make_batches(1, seed=7)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=9))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[str] = []
    context.register_hooks(
        before_backward=lambda w, loss: seen.append("before_backward"),
        after_step=lambda w, outcome: seen.append("after_step"),
    )
    state = (context, model, wrapper)
    c2, m2, w2 = pickle.loads(pickle.dumps(state)) if how == "pickle" else copy.deepcopy(state)
    w2.step(_closure(c2, w2, m2, batch, cell), make_optimizer_step=True)
    assert w2.last_outcome is not None
    assert seen == [], f"the {how} copy called the original's hooks: {seen} (HOOK-005: copies carry no hooks)"
    wrapper.step(_closure(context, wrapper, model, batch, cell), make_optimizer_step=True)
    assert seen == ["before_backward", "after_step"], f"the original lost its hooks after a {how}: {seen}"


# -- CTX-003: nested blocks, and a block left by an exception (decision 24) --------------------------------------


class _Planned(Exception):
    """Raised by the check inside a ``batch()`` block."""


@pytest.mark.requirement("CTX-003", "AMP-003", "STEP-003")
@pytest.mark.varies(
    window=("k >= 2 micro-steps",),
    position=("inside batch()",),
    faults=("raising closure",),
    loss_scale=("backed off",),
)
def test_a_batch_left_by_an_exception_ends_its_iteration(make_context: MakeContext, cell: Cell) -> None:
    """Batch 0 overflows (16-mixed) or accumulates, then raises; batch 1 closes the window it left open.

    Under 16-mixed the block's update must have backed the scale off before batch 1 (its loss is scaled by half the
    first scale); everywhere the window of batches 0 and 1 steps as one, and a nested ``batch()`` is refused.
    """
    batches = make_batches(3, seed=8)
    settings = GradScalerSettings(init_scale=2.0**10)
    mixed16 = cell.precision == "16-mixed"
    context = make_context(accumulate_grad_batches=2, grad_scaler=settings if mixed16 else None)
    base = make_model(seed=10)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    scales: list[float] = []

    def closure(batch: Batch, overflow: bool = False) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * (float("inf") if overflow else 1.0)
            loss.register_hook(lambda grad: scales.append(float(grad)))
            wrapper.backward(loss)
            return loss

        return run

    def first_block() -> None:
        with context.batch(0):
            with refuses(RuntimeError, "batch() inside a batch() block", "CTX-003: blocks do not nest"):
                context.batch(1).__enter__()
            if mixed16:  # a real step that overflows: the block's update must back the scale off
                wrapper.step(closure(batches[0], overflow=True), make_optimizer_step=True)
                assert wrapper.last_outcome is StepOutcome.SKIPPED_NON_FINITE
            wrapper.step(closure(batches[0]))
            raise _Planned

    with pytest.raises(_Planned):
        first_block()
    with context.batch(1):
        wrapper.step(closure(batches[1]))
    assert wrapper.last_outcome is StepOutcome.STEPPED, (
        f"batch 1 closes the window that batch 0 opened before raising; it ended {wrapper.last_outcome} (CTX-003)"
    )
    if mixed16:
        first = settings.init_scale / 2  # the recipe's scale(loss / N) with N = 2
        assert scales == [first, first, first / 2], (
            f"the losses were backpropagated with scales {scales}: after the overflow in a block left by an "
            f"exception, the scale must have backed off to {settings.init_scale / 2} (CTX-003, AMP-003)"
        )
    window_oracle = WindowOracle(oracle, torch.optim.SGD(oracle.parameters(), lr=0.1), cell, 2)
    if mixed16:  # the window stepped at the backed-off scale (its first micro-step rescaled to it, AMP-006)
        window_oracle.scaler = GradScaler(cell_device(cell).type, init_scale=settings.init_scale / 2)
    window_oracle.train_windows(batches, [[0, 1]])
    _assert_close(model, oracle, cell, "the window batch 0 left open and batch 1 closed")


# -- CLIP-001 and HOOK-002 on a non-finite 16-mixed window (decision 25) -----------------------------------------


@pytest.mark.requirement("CLIP-001", "HOOK-002", "AMP-004")
@pytest.mark.features("hooks")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.varies(clipping=("norm", "value"), window=("1 micro-step",))
def test_a_non_finite_window_is_clipped_as_the_recipe_clips_it(
    make_context: MakeContext, cell: Cell, algorithm: str
) -> None:
    """One bias's gradient is infinite: ``before_optimizer_step`` sees the window clipped as torch's recipe clips it."""
    batch = make_batches(1, seed=11)[0]
    clip = 0.5
    context = make_context(gradient_clip_val=clip, gradient_clip_algorithm=algorithm)
    base = make_model(seed=12)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[list[torch.Tensor]] = []
    context.register_hooks(
        before_optimizer_step=lambda w: seen.append(
            [p.grad.detach().float().cpu().clone() for p in model.parameters() if p.grad is not None]
        )
    )

    def loss_of(net: torch.nn.Module) -> torch.Tensor:
        return mse(net, batch, cell_device(cell), cell_dtype(cell)) + list(net.parameters())[1].sum() * float("inf")

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = loss_of(model)
        wrapper.backward(loss)
        return loss

    wrapper.step(closure, make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.SKIPPED_NON_FINITE
    scaler, optimizer = oracle_scaler(cell), torch.optim.SGD(oracle.parameters(), lr=0.1)
    assert scaler is not None
    with oracle_autocast(cell):
        loss = loss_of(oracle)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = [p for p in oracle.parameters() if p.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(grads, clip)
    else:
        torch.nn.utils.clip_grad_value_(grads, clip)
    want = [p.grad.detach().float().cpu() for p in grads if p.grad is not None]
    assert len(seen) == 1, f"before_optimizer_step ran {len(seen)} times for one real step (HOOK-002)"
    for i, (got, expected) in enumerate(zip(seen[0], want, strict=True)):
        assert torch.allclose(got, expected, equal_nan=True, rtol=1e-3, atol=1e-6), (
            f"gradient {i} as before_optimizer_step saw it is {got.flatten()[:4].tolist()}..., the recipe's clip "
            f"({algorithm}) of the non-finite window gives {expected.flatten()[:4].tolist()}... (CLIP-001, HOOK-002)"
        )


# -- SCHED-001 and SCHED-002: a skip beside a window that accumulates (decision 26) ------------------------------

_BEFORE = "before `optimizer.step()`"


@pytest.mark.requirement("SCHED-002", "SCHED-001")
@pytest.mark.features("lr_schedulers")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("built_on", ["wrapper", "inner optimizer"])
@pytest.mark.varies(wrappers=("2",), window=("open while another optimizer steps",), make_optimizer_step=("False",))
def test_a_skipped_step_beside_an_accumulating_window_warns_as_torch(
    make_context: MakeContext, cell: Cell, built_on: str
) -> None:
    """A skips for overflow while B accumulates: A's scheduler never warns; B's warns as torch's would.

    torch warns for B's scheduler built on the inner optimizer (that optimizer has not stepped), not for one built
    on the wrapper (its patched ``step`` counts every call).
    """
    batch = make_batches(1, seed=13)[0]
    context = make_context(grad_scaler=GradScalerSettings(init_scale=2.0**10))
    model = context.prepare_module(Halves(14, 15))
    assert isinstance(model, Halves)
    sgd_a, sgd_b = torch.optim.SGD(model.a.parameters(), lr=0.1), torch.optim.SGD(model.b.parameters(), lr=0.1)
    a, b = context.wrap(sgd_a), context.wrap(sgd_b)
    on: dict[str, Any] = {"wrapper": (a, b), "inner optimizer": (sgd_a, sgd_b)}
    schedulers = [torch.optim.lr_scheduler.StepLR(opt, step_size=1) for opt in on[built_on]]

    def overflowing() -> torch.Tensor:
        with context.autocast():
            loss = mse(model.a, batch, cell_device(cell), cell_dtype(cell)) * float("inf")
        a.backward(loss)
        return loss

    with context.batch(0):
        a.step(overflowing, make_optimizer_step=True)
        b.step(_closure(context, b, model.b, batch, cell), make_optimizer_step=False)
    assert (a.last_outcome, b.last_outcome) == (StepOutcome.SKIPPED_NON_FINITE, StepOutcome.ACCUMULATED)
    said = []
    for name, scheduler in zip("ab", schedulers, strict=True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scheduler.step()
        said.append((name, any(_BEFORE in str(w.message) for w in caught)))
    want = [("a", False), ("b", built_on == "inner optimizer")]
    assert said == want, (
        f"schedulers built on the {built_on} warned {said}, expected {want}: a skipped real step counts as the "
        "optimizer's step (SCHED-002); a call that only accumulated warns as torch does (SCHED-001)"
    )


# -- ERR-005: a state torch loads (decision 27) ------------------------------------------------------------------


@pytest.mark.requirement("ERR-005", "CKPT-001")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(precisions=("32-true",))
@pytest.mark.varies(optimizer=("Adam",), faults=("refused load",))
def test_a_state_torch_loads_the_wrapper_loads(make_context: MakeContext, cell: Cell) -> None:
    """An Adam state whose ``exp_avg`` has another shape loads as into a bare Adam (torch finds it when it steps)."""
    batch = make_batches(1, seed=16)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=17))
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.01))
    wrapper.step(_closure(context, wrapper, model, batch, cell), make_optimizer_step=True)
    state = copy.deepcopy(wrapper.state_dict())
    state["state"][0]["exp_avg"] = torch.zeros(3, device=cell_device(cell))
    bare = torch.optim.Adam(copy.deepcopy(model).parameters(), lr=0.01)
    bare.load_state_dict(copy.deepcopy(state))
    wrapper.load_state_dict(copy.deepcopy(state))
    assert wrapper.state_dict()["state"][0]["exp_avg"].shape == bare.state_dict()["state"][0]["exp_avg"].shape, (
        "the wrapper loaded a state tensor of another shape differently from torch's Adam (ERR-005)"
    )


# -- STEP-004 and CKPT-002: last_outcome is the wrapper's, not the context's state (decision 28) -----------------


@pytest.mark.requirement("STEP-004", "CKPT-002", "PICKLE-001")
@pytest.mark.features("checkpointing", "pickling")
@pytest.mark.varies(copies=("checkpoint", "deepcopy"), outcome_read=("after its own call",))
def test_last_outcome_is_not_in_the_context_state(make_context: MakeContext, cell: Cell) -> None:
    """After ``load_state_dict`` a fresh wrapper's ``last_outcome`` is ``None``; a deep copy keeps the original's."""
    batch = make_batches(1, seed=18)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=19))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.step(_closure(context, wrapper, model, batch, cell), make_optimizer_step=True)
    state = context.state_dict()
    fresh = make_context()
    fresh_model = fresh.prepare_module(make_model(seed=19))
    fresh_wrapper = fresh.wrap(torch.optim.SGD(fresh_model.parameters(), lr=0.1))
    fresh.load_state_dict(state)
    assert fresh_wrapper.last_outcome is None, (
        f"after load_state_dict a wrapper that made no call reads {fresh_wrapper.last_outcome} (STEP-004: None "
        "until its first call; last_outcome is not part of the context's state)"
    )
    _, copied = copy.deepcopy((context, wrapper))
    assert copied.last_outcome is wrapper.last_outcome is not None, "a copy carries last_outcome (PICKLE-001)"


# -- CLIP-002: every other backward refused, the closing step's own evaluations not (decision 29) ----------------


@pytest.mark.requirement("CLIP-002")
@pytest.mark.varies(
    wrappers=("2",), clipping=("unscale_gradients() by hand",), faults=("invalid argument",), window=("1 micro-step",)
)
def test_a_prepared_window_refuses_a_backward_over_other_parameters(make_context: MakeContext, cell: Cell) -> None:
    """After A's ``unscale_gradients()``, B's backward over disjoint parameters is refused and writes nothing."""
    batch = make_batches(1, seed=20)[0]
    context = make_context()
    base = Halves(21, 22)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    a = context.wrap(torch.optim.SGD(model.a.parameters(), lr=0.1))
    b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=0.1))
    with context.batch(0, is_last=True):
        _closure(context, a, model.a, batch, cell)()
        a.unscale_gradients()
        with context.autocast():
            loss_b = mse(model.b, batch, cell_device(cell), cell_dtype(cell))
        with refuses(RuntimeError, "B's backward() after A's unscale_gradients()", "CLIP-002: any wrapper"):
            b.backward(loss_b)
        assert all(p.grad is None for p in model.b.parameters()), "the refused backward wrote B's gradients"
        a.step()
    WindowOracle(oracle.a, torch.optim.SGD(oracle.a.parameters(), lr=0.1), cell).train_windows([batch], [[0]])
    _assert_close(model.a, oracle.a, cell, "A's prepared window, stepped")


@pytest.mark.requirement("CLIP-002", "AMP-002")
@pytest.mark.varies(clipping=("unscale_gradients() by hand", "norm"), window=("k >= 2 micro-steps",))
def test_a_second_unscale_gradients_prepares_nothing_again(make_context: MakeContext, cell: Cell) -> None:
    """``unscale_gradients()`` twice before the closing step: the window is averaged, unscaled and clipped once."""
    batches = make_batches(2, seed=23)
    clip = 0.05
    context = make_context(accumulate_grad_batches=2, gradient_clip_val=clip)
    base = make_model(seed=24)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    with context.batch(0):
        wrapper.step(_closure(context, wrapper, model, batches[0], cell))
    with context.batch(1):
        _closure(context, wrapper, model, batches[1], cell)()
        wrapper.unscale_gradients()
        once = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        wrapper.unscale_gradients()
        twice = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        for i, (x, y) in enumerate(zip(once, twice, strict=True)):
            assert torch.equal(x, y), f"a second unscale_gradients() changed gradient {i} (CLIP-002: prepared once)"
        wrapper.step()
    assert wrapper.last_outcome is StepOutcome.STEPPED
    scaler, optimizer = oracle_scaler(cell), torch.optim.SGD(oracle.parameters(), lr=0.1)
    for batch in batches:
        with oracle_autocast(cell):
            loss = mse(oracle, batch, cell_device(cell), cell_dtype(cell))
        (loss / 2 if scaler is None else scaler.scale(loss / 2)).backward()
    if scaler is not None:
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(list(oracle.parameters()), clip)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
    oracle_step_done(cell)
    _assert_close(model, oracle, cell, "a window prepared by two unscale_gradients() calls")


class _Sam(torch.optim.SGD):
    """A two-pass optimizer: its step evaluates the closure twice and steps on the second evaluation's gradients."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)
        self.autocast: list[tuple[bool, torch.dtype]] = []

    def step(self, closure: Any = None) -> Any:
        assert closure is not None, "the two-pass optimizer needs its closure"
        first = closure()
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=0.05)
        closure()
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.sub_(p.grad, alpha=0.05)
        super().step()
        return first


@pytest.mark.requirement("CLOS-005", "CLIP-002", "CLOS-001")
@pytest.mark.cells(precisions=NOT_16)
@pytest.mark.varies(optimizer=("two-pass (SAM)",), clipping=("unscale_gradients() by hand",))
def test_reevaluations_run_in_the_autocast_region_and_may_backward(make_context: MakeContext, cell: Cell) -> None:
    """A two-pass optimizer's second evaluation runs in the first's autocast region; its backward is not refused.

    The closure calls ``unscale_gradients()`` after its backward, so the window is prepared when the inner optimizer
    evaluates it again: that evaluation's backward belongs to the closing step (CLIP-002's exception).
    """
    batch = make_batches(1, seed=25)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=26))
    sam = _Sam(model.parameters())
    wrapper = context.wrap(sam)
    regions: list[tuple[bool, torch.dtype]] = []
    device_type = cell_device(cell).type

    def closure() -> torch.Tensor:
        regions.append((torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)))
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        wrapper.backward(loss)
        wrapper.unscale_gradients()
        return loss

    wrapper.step(closure, make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED
    assert len(regions) == 2, f"the closure ran {len(regions)} times, not twice (once, then SAM's re-evaluation)"
    want = cell.precision == "bf16-mixed"
    assert [enabled for enabled, _ in regions] == [want, want], (
        f"autocast enabled in the two evaluations: {[e for e, _ in regions]}, expected {[want, want]}: a "
        "re-evaluation runs in the context's autocast region as the first does (CLOS-005)"
    )
    if want:
        assert regions[1][1] == torch.bfloat16, f"the re-evaluation autocast to {regions[1][1]}, not bfloat16"
