"""Checks of the readings that ``docs/decisions.md`` entries 20 to 33 decided, each failing the other reading.

The contract's text left these questions open, and an implementation written from it could read them either way.
Each check here passes the reading the contract chose and fails the other one; the broken implementations in
``tests/mutants`` that take the other reading show it (each one's ``MUTANT`` names the checks that catch it). Expected
values come from a plain-PyTorch loop written beside the check, or are worked by hand.
"""

from __future__ import annotations

import copy
import gc
import pickle
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import assert_unchanged, cloned, param_values, snapshot, state_diff
from lightning_optimizer.conformance.harness import (
    UNSCALED_PRECISIONS,
    Batch,
    Halves,
    PlannedFailure,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_scaler,
    refuses,
    tolerance_for,
    untrained_dtypes,
)
from lightning_optimizer.conformance.optimizer_kinds import (
    DeclaredEvaluatingSGD,
    EvaluatingSGD,
    KeywordsOnlySGD,
    NoClosureSGD,
    RecordingSGD,
    TwoPassSAM,
    closure_of,
)
from lightning_optimizer.conformance.oracles import WindowOracle, oracle_copy
from lightning_optimizer.conformance.plain_loop import clipper, real_step, scaled_backward, train_windows
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
MIXED = ("16-mixed", "bf16-mixed")
REFUSING_A_DTYPE = ("64-true", "16-mixed", "bf16-true", "16-true")
"""The precisions that refuse a parameter of some floating-point dtype (ERR-007, ``harness.untrained_dtypes``)."""


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
    b_before = param_values(model.b.parameters())
    refused: list[BaseException] = []
    inner = closure_of(context, a, model.a, batch, cell)

    def closure() -> torch.Tensor:
        loss = inner()
        try:
            b.step(closure_of(context, b, model.b, batch, cell), make_optimizer_step=True)
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
    assert_params_close(model.a, oracle.a, cell, "the outer call whose closure caught the refusal")
    for got, want in zip(model.b.parameters(), b_before, strict=True):
        assert torch.equal(got.detach(), want), "the refused step() changed wrapper b's parameters (REENT-001)"


# -- ERR-010: wrapped once while the context lives (decision 21) -------------------------------------------------


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
    wrapper.step(closure_of(first, wrapper, model, batch, cell), make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED, "the refused second wrap() broke the first wrapper"
    second = make_context()
    alive = weakref.ref(first)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del first, wrapper
        if alive() is not None:  # kept by its own reference cycles: still live until collected
            with refuses(ValueError, "wrap() by another context", "ERR-010: a context is live until collected"):
                second.wrap(sgd)
    finally:
        if enabled:
            gc.enable()
    gc.collect()
    assert alive() is None, "the context outlived every reference the check held (ERR-010: nothing else may keep it)"
    again = second.wrap(sgd)
    again.step(closure_of(second, again, model, batch, cell), make_optimizer_step=True)
    assert again.last_outcome is StepOutcome.STEPPED


# -- CLOS-005: a call without a closure, and what takes one (decision 22) ---------------------------------------


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
    inner = RecordingSGD(model.parameters(), lr=0.1)
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
    assert_params_close(model, oracle, cell, "backward-then-step() calls")


@pytest.mark.requirement("CLOS-005", "STEP-006")
@pytest.mark.cells(precisions=UNSCALED_PRECISIONS)
@pytest.mark.varies(optimizer=("step(closure) recorded",), call_form=("closure, wrapper.backward",))
def test_what_takes_a_closure_is_what_binds_closure(make_context: MakeContext, cell: Cell) -> None:
    """A ``step(**kwargs)`` gets the closure (its first call returns the result); a ``step()`` with none gets none."""
    batch = make_batches(1, seed=6)[0]
    context = make_context()
    model = context.prepare_module(Halves(9, 10))
    assert isinstance(model, Halves)
    keywords, bare = KeywordsOnlySGD(model.a.parameters(), lr=0.1), NoClosureSGD(model.b.parameters(), lr=0.1)
    wa, wb = context.wrap(keywords), context.wrap(bare)
    with context.batch(0, is_last=True):
        got = wa.step(closure_of(context, wa, model.a, batch, cell), make_optimizer_step=True)
        wb.step(closure_of(context, wb, model.b, batch, cell), make_optimizer_step=True)
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
    w2.step(closure_of(c2, w2, m2, batch, cell), make_optimizer_step=True)
    assert w2.last_outcome is not None
    assert seen == [], f"the {how} copy called the original's hooks: {seen} (HOOK-005: copies carry no hooks)"
    wrapper.step(closure_of(context, wrapper, model, batch, cell), make_optimizer_step=True)
    assert seen == ["before_backward", "after_step"], f"the original lost its hooks after a {how}: {seen}"


# -- CTX-003: nested blocks, and a block left by an exception (decision 24) --------------------------------------


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
            raise PlannedFailure

    with pytest.raises(PlannedFailure):
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
    assert_params_close(model, oracle, cell, "the window batch 0 left open and batch 1 closed")


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
    scaler, want = oracle_scaler(cell), list[torch.Tensor]()
    with oracle_autocast(cell):
        loss = loss_of(oracle)
    scaled_backward(loss, scaler)
    real_step(
        torch.optim.SGD(oracle.parameters(), lr=0.1),
        1,
        scaler,
        clip=clipper(algorithm, clip),
        after_prepare=lambda params: want.extend(p.grad.detach().float().cpu() for p in params if p.grad is not None),
    )
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
@pytest.mark.parametrize("first", ["skip first", "accumulate first"])
@pytest.mark.varies(wrappers=("2",), window=("open while another optimizer steps",), make_optimizer_step=("False",))
def test_a_skipped_step_beside_an_accumulating_window_warns_as_torch(
    make_context: MakeContext, cell: Cell, built_on: str, first: str
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
        calls: list[Callable[[], object]] = [
            lambda: a.step(overflowing, make_optimizer_step=True),
            lambda: b.step(closure_of(context, b, model.b, batch, cell), make_optimizer_step=False),
        ]
        for call in calls if first == "skip first" else calls[::-1]:
            call()
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
    wrapper.step(closure_of(context, wrapper, model, batch, cell), make_optimizer_step=True)
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
    wrapper.step(closure_of(context, wrapper, model, batch, cell), make_optimizer_step=True)
    state = context.state_dict()
    fresh = make_context()
    fresh_model = fresh.prepare_module(make_model(seed=19))
    fresh_wrapper = fresh.wrap(torch.optim.SGD(fresh_model.parameters(), lr=0.1))
    fresh.load_state_dict(state)
    assert fresh_wrapper.last_outcome is None, (
        f"after load_state_dict a wrapper that made no call reads {fresh_wrapper.last_outcome} (STEP-004: None "
        "until its first call; last_outcome is not part of the context's state)"
    )
    wrapper.load_state_dict(wrapper.state_dict())
    context.load_state_dict(fresh.state_dict())
    assert wrapper.last_outcome is not None, (
        "loading a state into a context changed its wrapper's last_outcome to None (STEP-004: load_state_dict does "
        "not change it)"
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
        closure_of(context, a, model.a, batch, cell)()
        a.unscale_gradients()
        with context.autocast():
            loss_b = mse(model.b, batch, cell_device(cell), cell_dtype(cell))
        with refuses(RuntimeError, "B's backward() after A's unscale_gradients()", "CLIP-002: any wrapper"):
            b.backward(loss_b)
        assert all(p.grad is None for p in model.b.parameters()), "the refused backward wrote B's gradients"
        a.step()
    WindowOracle(oracle.a, torch.optim.SGD(oracle.a.parameters(), lr=0.1), cell).train_windows([batch], [[0]])
    assert_params_close(model.a, oracle.a, cell, "A's prepared window, stepped")


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
        wrapper.step(closure_of(context, wrapper, model, batches[0], cell))
    with context.batch(1):
        closure_of(context, wrapper, model, batches[1], cell)()
        wrapper.unscale_gradients()
        once = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        wrapper.unscale_gradients()
        twice = [p.grad.detach() for p in model.parameters() if p.grad is not None]
        for i, (x, y) in enumerate(zip(once, twice, strict=True)):
            assert torch.equal(x, y), f"a second unscale_gradients() changed gradient {i} (CLIP-002: prepared once)"
        wrapper.step()
    assert wrapper.last_outcome is StepOutcome.STEPPED
    optimizer, clip_norm = torch.optim.SGD(oracle.parameters(), lr=0.1), clipper("norm", clip)
    train_windows(
        cell, oracle, optimizer, batches, [[0, 1]], oracle_scaler(cell), accumulate=2, factor=1.0, clip=clip_norm
    )
    assert_params_close(model, oracle, cell, "a window prepared by two unscale_gradients() calls")


@pytest.mark.requirement("CLOS-005", "CLIP-002", "CLOS-001")
@pytest.mark.cells(precisions=UNSCALED_PRECISIONS)
@pytest.mark.varies(optimizer=("two-pass (SAM)",), clipping=("unscale_gradients() by hand",))
def test_reevaluations_run_in_the_autocast_region_and_may_backward(make_context: MakeContext, cell: Cell) -> None:
    """A two-pass optimizer's second evaluation runs in the first's autocast region; its backward is not refused.

    The closure calls ``unscale_gradients()`` after its backward, so the window is prepared when the inner optimizer
    evaluates it again: that evaluation's backward belongs to the closing step (CLIP-002's exception).
    """
    batch = make_batches(1, seed=25)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=26))
    wrapper = context.wrap(TwoPassSAM(model.parameters()))
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


# -- PREC-001 and PREC-002: buffers (decision 30) ----------------------------------------------------------------


@pytest.mark.requirement("PREC-001", "PREC-002")
@pytest.mark.varies(modules=("1 prepared module",))
def test_prepare_module_casts_floating_buffers_only(make_context: MakeContext, cell: Cell) -> None:
    """BatchNorm's running statistics take the precision's parameter dtype; ``num_batches_tracked`` stays int64.

    A training step in train mode then updates them as the plain module, cast by ``module.to`` the same way, does.
    """
    batch = make_batches(1, seed=28)[0]
    context = make_context()
    base = torch.nn.Sequential(make_model(seed=27), torch.nn.BatchNorm1d(2))  # float statistics, an int count
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    norm = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    assert len(norm) == 1, "prepare_module must keep the module's BatchNorm"
    want = cell_dtype(cell)
    got = {name: buffer.dtype for name, buffer in norm[0].named_buffers()}
    expected = {"running_mean": want, "running_var": want, "num_batches_tracked": torch.int64}
    assert got == expected, (
        f"prepare_module left BatchNorm's buffers as {got} in {cell.precision}, expected {expected}: floating-point "
        "buffers take the precision's parameter dtype, others keep theirs (PREC-001, PREC-002)"
    )
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper.step(closure_of(context, wrapper, model, batch, cell), make_optimizer_step=True)
    with oracle_autocast(cell):
        oracle(batch[0].to(cell_device(cell), cell_dtype(cell)))
    tol = tolerance_for(cell)
    got_mean, want_mean = norm[0].running_mean, oracle[1].running_mean  # type: ignore[index]
    assert got_mean is not None and isinstance(want_mean, torch.Tensor)
    assert torch.allclose(got_mean.cpu().double(), want_mean.cpu().double(), rtol=tol.rtol, atol=tol.atol), (
        "the running mean after one training forward differs from the plain module's"
    )


# -- ERR-007: frozen parameters (decision 31) --------------------------------------------------------------------


@pytest.mark.requirement("ERR-007")
@pytest.mark.cells(precisions=REFUSING_A_DTYPE)
@pytest.mark.varies(parameters=("frozen",), param_groups=("1", "added after wrap"), faults=("invalid argument",))
def test_wrap_refuses_a_frozen_parameter_of_another_dtype(make_context: MakeContext, cell: Cell) -> None:
    """A frozen parameter of a dtype the precision does not train, or off the device: refused by ``wrap`` too.

    ``add_param_group`` refuses it before the inner optimizer changes; on an accelerator a CPU one is refused too.
    (32-true and bf16-mixed train every floating-point dtype: no cell of theirs has a dtype to refuse.)
    """
    context = make_context()
    model = context.prepare_module(make_model(seed=29))
    other = untrained_dtypes(cell)[0]
    frozen = torch.nn.Parameter(torch.zeros(3, dtype=other, device=cell_device(cell)), requires_grad=False)
    with refuses(ValueError, f"wrap() of an optimizer holding a frozen {other} parameter", "ERR-007: frozen too"):
        context.wrap(torch.optim.SGD([*model.parameters(), frozen], lr=0.1))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = context.wrap(inner)
    with refuses(ValueError, "add_param_group() with a frozen parameter of another dtype", "ERR-007: frozen too"):
        wrapper.add_param_group({"params": [frozen]})
    assert len(inner.param_groups) == 1, "the refused add_param_group() changed the inner optimizer"
    if cell.device != "cpu":
        on_cpu = torch.nn.Parameter(torch.zeros(3, dtype=cell_dtype(cell)), requires_grad=False)
        with refuses(ValueError, "add_param_group() with a frozen parameter on the CPU", "ERR-007: frozen too"):
            wrapper.add_param_group({"params": [on_cpu]})


# -- CLOS-002 and HOOK-002: declared by attribute; hooks once per real step (decision 32) -------------------------


DECLARATIONS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "class attribute": lambda params: DeclaredEvaluatingSGD(params, evaluations=3, lr=0.1),
    "instance attribute": lambda params: EvaluatingSGD(params, evaluations=3, declares=True, lr=0.1),
}
"""An optimizer that evaluates its closure three times, declaring ``evaluates_closure = True`` either way."""


@pytest.mark.requirement("CLOS-002", "AMP-005")
@pytest.mark.parametrize("declared", list(DECLARATIONS))
@pytest.mark.varies(optimizer=("step(closure) recorded",), make_optimizer_step=("False",), faults=("invalid argument",))
def test_an_optimizer_declaring_evaluates_closure_is_refused_accumulation(
    make_context: MakeContext, cell: Cell, declared: str
) -> None:
    """``evaluates_closure = True``, on the class or the instance: the optimizer cannot accumulate.

    Refused at ``wrap`` with a window longer than one (and in 16-mixed), at ``step`` for ``make_optimizer_step=False``
    before the closure runs.
    """
    build = DECLARATIONS[declared]
    mixed16 = cell.precision == "16-mixed"
    longer = make_context(accumulate_grad_batches=2)
    model = longer.prepare_module(make_model(seed=30))
    with refuses((ValueError, TypeError), "wrap() with accumulate_grad_batches=2", "CLOS-002: it cannot accumulate"):
        longer.wrap(build(model.parameters()))
    context = make_context()
    model = context.prepare_module(make_model(seed=30))
    if mixed16:
        with refuses(TypeError, f"wrap() under 16-mixed of an optimizer declaring it by {declared}", "AMP-005: no"):
            context.wrap(build(model.parameters()))
        return
    wrapper = context.wrap(build(model.parameters()))
    ran: list[int] = []
    with refuses(ValueError, "step(make_optimizer_step=False)", "CLOS-002: an evaluator cannot accumulate"):
        wrapper.step(lambda: ran.append(1), make_optimizer_step=False)
    assert ran == [], "the refused step() ran its closure (CLOS-002: refused before the closure runs)"


_EVALUATORS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "LBFGS": lambda params: torch.optim.LBFGS(params, lr=0.1, max_iter=3),
    **DECLARATIONS,
}
"""torch's LBFGS and an optimizer declaring ``evaluates_closure`` (class or instance): each evaluates the closure."""


@pytest.mark.requirement("CLOS-002", "FAIL-005")
@pytest.mark.features("closure_evaluating_optimizers")
@pytest.mark.cells(devices=("cpu", "cuda"), precisions=UNSCALED_PRECISIONS)  # XLA would add compile time only
@pytest.mark.parametrize("evaluator", list(_EVALUATORS))
@pytest.mark.parametrize("at", [1, 2], ids=["first-evaluation", "second-evaluation"])
@pytest.mark.varies(
    optimizer=("LBFGS", "step(closure) recorded"),
    faults=("invalid argument",),
    call_form=("closure, wrapper.backward",),
)
def test_an_evaluating_optimizers_closure_must_return_the_loss(
    make_context: MakeContext, cell: Cell, evaluator: str, at: int
) -> None:
    """The closure of an optimizer that evaluates it itself returns ``None`` in one evaluation: ``TypeError``.

    The error says the closure must return the loss (not the optimizer's own ``float(None)``), and the call changes
    nothing (FAIL-005): parameters, gradients and the optimizer's state as before; the next step works.
    """
    batches = make_batches(2, seed=33)
    context = make_context()
    model = context.prepare_module(make_model(seed=34))
    wrapper = context.wrap(_EVALUATORS[evaluator](model.parameters()))
    inner = closure_of(context, wrapper, model, batches[0], cell)
    wrapper.step(inner, make_optimizer_step=True)  # a history (LBFGS) or a state to keep
    calls: list[int] = []

    def closure() -> torch.Tensor | None:
        calls.append(1)
        loss = inner()
        return None if len(calls) == at else loss

    before, state = snapshot(model), cloned(wrapper.optimizer.state_dict())
    what = f"{evaluator}'s step(closure) whose closure returns None in evaluation {at}"
    with refuses(TypeError, what, "CLOS-002: the closure of an evaluating optimizer must return the loss") as raised:
        wrapper.step(closure, make_optimizer_step=True)
    message = str(raised.value)
    assert "return" in message.lower(), f"{what} raised {message!r}: say that the closure must return the loss"
    assert len(calls) >= at, f"{what}: the closure ran {len(calls)} times (check precondition)"
    assert_unchanged(model, before, f"{what} (FAIL-005: nothing changes)")
    problem = state_diff(wrapper.optimizer.state_dict(), state)
    assert problem is None, f"{what}: the optimizer's state changed (FAIL-005): {problem}"
    wrapper.step(closure_of(context, wrapper, model, batches[1], cell), make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED, f"the step after {what}: {wrapper.last_outcome}"


@pytest.mark.requirement("HOOK-002", "HOOK-003", "HOOK-001", "CLOS-004")
@pytest.mark.features("hooks", "closure_evaluating_optimizers")
@pytest.mark.cells(precisions=UNSCALED_PRECISIONS)
@pytest.mark.parametrize("declared", list(DECLARATIONS))
@pytest.mark.varies(optimizer=("LBFGS", "step(closure) recorded"), call_form=("closure, wrapper.backward",))
def test_hooks_of_an_evaluating_optimizer_run_once_per_real_step(
    make_context: MakeContext, cell: Cell, declared: str
) -> None:
    """Three evaluations in one real step: one ``before_optimizer_step``, one ``after_step``.

    Each evaluation runs its backward hooks and starts from cleared gradients.
    """
    batch = make_batches(1, seed=31)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=32))
    wrapper = context.wrap(DECLARATIONS[declared](model.parameters()))
    events: list[str] = []
    context.register_hooks(
        before_backward=lambda w, loss: events.append("before_backward"),
        after_backward=lambda w, loss: events.append("after_backward"),
        before_optimizer_step=lambda w: events.append("before_optimizer_step"),
        after_step=lambda w, outcome: events.append("after_step"),
    )
    cleared: list[bool] = []
    inner = closure_of(context, wrapper, model, batch, cell)

    def closure() -> torch.Tensor:
        cleared.append(all(p.grad is None or not p.grad.any() for p in model.parameters()))
        return inner()

    wrapper.step(closure, make_optimizer_step=True)
    want = ["before_optimizer_step", *["before_backward", "after_backward"] * 3, "after_step"]
    assert events == want, f"the hooks ran {events}, expected {want} (HOOK-002, HOOK-003: once per real step)"
    assert cleared == [True] * 3, f"gradients cleared before each evaluation: {cleared} (CLOS-004)"


# -- HOOK-004: several registrations, every kind (decision 33) ---------------------------------------------------


@pytest.mark.requirement("HOOK-004", "HOOK-001", "HOOK-002", "HOOK-003")
@pytest.mark.features("hooks")
@pytest.mark.varies(wrappers=("1",), window=("k >= 2 micro-steps",), make_optimizer_step=("None",))
def test_hooks_of_several_registrations_run_in_registration_order(make_context: MakeContext, cell: Cell) -> None:
    """Three ``register_hooks`` calls with different kinds: each kind runs in registration order.

    ``remove()`` of the second stops its hooks only.
    """
    batches = make_batches(4, seed=33)
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model(seed=34))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    events: list[str] = []

    def hooks(tag: str, *kinds: str) -> dict[str, Any]:
        made: dict[str, Any] = {
            "before_backward": lambda w, loss: events.append(f"before_backward {tag}"),
            "after_backward": lambda w, loss: events.append(f"after_backward {tag}"),
            "before_optimizer_step": lambda w: events.append(f"before_optimizer_step {tag}"),
            "after_step": lambda w, outcome: events.append(f"after_step {tag}"),
        }
        return {kind: made[kind] for kind in kinds}

    context.register_hooks(**hooks("1", "after_step", "before_backward"))
    second = context.register_hooks(
        **hooks("2", "before_backward", "after_backward", "before_optimizer_step", "after_step")
    )
    context.register_hooks(**hooks("3", "before_optimizer_step", "after_backward", "after_step"))

    def expected(tags: tuple[str, ...], real: bool) -> list[str]:
        by_kind = {
            "before_backward": ("1", "2"),
            "after_backward": ("2", "3"),
            "before_optimizer_step": ("2", "3"),
            "after_step": ("1", "2", "3"),
        }
        order = ["before_backward", "after_backward", *(["before_optimizer_step"] if real else []), "after_step"]
        return [f"{kind} {tag}" for kind in order for tag in by_kind[kind] if tag in tags]

    want: list[str] = []
    for batch_idx, batch in enumerate(batches):
        if batch_idx == 2:
            second.remove()
        tags = ("1", "3") if batch_idx >= 2 else ("1", "2", "3")
        with context.batch(batch_idx, is_last=batch_idx == 3):
            wrapper.step(closure_of(context, wrapper, model, batch, cell))
        want += expected(tags, real=batch_idx % 2 == 1)
    assert events == want, f"the hooks ran in the order {events}, expected {want} (HOOK-004: registration order)"


# -- STEP-006: whatever the inner step returns (decision 34) -----------------------------------------------------


RETURNS: dict[str, Any] = {"another tensor": torch.ones(1), "a float": 2.5, "None": None, "an object": object()}


@pytest.mark.requirement("STEP-006")
@pytest.mark.parametrize("returns", list(RETURNS))
@pytest.mark.varies(
    optimizer=("step(closure) recorded",),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
)
def test_step_returns_the_closure_result_whatever_the_inner_returns(
    make_context: MakeContext, cell: Cell, returns: str
) -> None:
    """The inner ``step`` returns another value: ``step()`` still returns the closure's result, ``None`` without."""
    batches = make_batches(3, seed=35)
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model(seed=36))
    wrapper = context.wrap(EvaluatingSGD(model.parameters(), returns=RETURNS[returns], lr=0.1))
    for batch_idx, flag in enumerate((False, None, True)):
        closure = closure_of(context, wrapper, model, batches[batch_idx], cell)
        results: list[torch.Tensor] = []
        with context.batch(batch_idx, is_last=batch_idx == 2):

            def recording(
                closure: Callable[[], torch.Tensor] = closure, results: list[torch.Tensor] = results
            ) -> torch.Tensor:
                results.append(closure())
                return results[-1]

            got = wrapper.step(recording, make_optimizer_step=flag)
        assert results and got is results[0], (
            f"batch {batch_idx}: step() returned {got!r}, not the closure's first result, with an inner step that "
            f"returns {returns} (STEP-006)"
        )
    closure_of(context, wrapper, model, batches[0], cell)()
    assert wrapper.step(make_optimizer_step=True) is None, "STEP-006: None without a closure"


@pytest.mark.requirement("STEP-006", "CLOS-002")
@pytest.mark.features("closure_evaluating_optimizers")
@pytest.mark.cells(precisions=UNSCALED_PRECISIONS)
@pytest.mark.varies(optimizer=("step(closure) recorded",), make_optimizer_step=("True",))
def test_an_evaluating_optimizer_step_returns_its_first_evaluation(make_context: MakeContext, cell: Cell) -> None:
    """A declared evaluator evaluates three times and returns another value: ``step()`` returns the first result."""
    batch = make_batches(1, seed=37)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=38))
    wrapper = context.wrap(DeclaredEvaluatingSGD(model.parameters(), 3, "the inner step's own value", lr=0.1))
    inner = closure_of(context, wrapper, model, batch, cell)
    results: list[torch.Tensor] = []

    def closure() -> torch.Tensor:
        results.append(inner())
        return results[-1]

    got = wrapper.step(closure, make_optimizer_step=True)
    assert len(results) == 3 and got is results[0], (
        f"step() returned {got!r}: an evaluating optimizer's step() returns its first evaluation's result, whatever "
        "its inner step returns (STEP-006)"
    )


# -- HOOK-003 and HOOK-004 against the blind broken implementations that survived --------------------------------


@pytest.mark.requirement("HOOK-003")
@pytest.mark.features("hooks")
@pytest.mark.varies(faults=("raising closure after its backward",), make_optimizer_step=("True", "False"))
def test_a_call_that_raises_runs_no_after_step(make_context: MakeContext, cell: Cell) -> None:
    """A closure that raises after its backward, accumulating or closing: ``after_step`` does not run for that call."""
    batch = make_batches(1, seed=39)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=40))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[StepOutcome] = []
    context.register_hooks(after_step=lambda w, outcome: seen.append(outcome))
    inner = closure_of(context, wrapper, model, batch, cell)

    def raising() -> torch.Tensor:
        inner()
        raise PlannedFailure

    for flag in (False, True):
        with pytest.raises(PlannedFailure):
            wrapper.step(raising, make_optimizer_step=flag)
    assert seen == [], f"after_step ran for calls that raised, with {seen} (HOOK-003: a call that raises runs none)"
    wrapper.step(inner, make_optimizer_step=True)
    assert seen == [wrapper.last_outcome], f"after_step saw {seen} for the call that returned"


@pytest.mark.requirement("HOOK-004")
@pytest.mark.features("hooks")
@pytest.mark.varies(faults=("invalid argument",))
def test_a_refused_registration_registers_nothing(make_context: MakeContext, cell: Cell) -> None:
    """``register_hooks`` with one hook that is not callable raises ``TypeError`` and registers none of the call's."""
    batch = make_batches(1, seed=41)[0]
    context = make_context()
    model = context.prepare_module(make_model(seed=42))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[str] = []
    with refuses(TypeError, "register_hooks(after_step='not callable', ...)", "HOOK-004: refused when registered"):
        context.register_hooks(
            before_backward=lambda w, loss: seen.append("before_backward"),
            before_optimizer_step=lambda w: seen.append("before_optimizer_step"),
            after_step="not callable",  # type: ignore[arg-type]
        )
    wrapper.step(closure_of(context, wrapper, model, batch, cell), make_optimizer_step=True)
    assert seen == [], f"a refused register_hooks() call left hooks registered: {seen} (HOOK-004: nothing registered)"
