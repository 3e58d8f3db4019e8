"""Checks of windows changed from outside the wrappers (WIN-001, WIN-002) and of ``discard()`` (FAIL-009).

A window's gradients cleared by ``model.zero_grad()``, or its optimizer's parameters changed behind its wrapper's
back, are found by the next call that would use the window, which raises before anything changes; ``discard()``
drops the window, and the loop goes on as a plain loop that skipped it. Every expected value comes from a plain
PyTorch loop beside the check (:class:`~.failure_rigs.Rig`'s oracle over the windows each case leaves, or a loop
written here), never from the implementation under test.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.failure_rigs import EAGER, Rig
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
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
A, S, D = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.DISCARDED
BATCHES = 8
"""Batches per epoch in the rigs here: wrapper ``a`` closes its windows at the batches each case gives, ``b`` every
second batch."""


def _b_closes(batch_idx: int) -> bool:
    return batch_idx % 2 == 1


def _b_windows(cut: int | None = None) -> list[tuple[int, ...]]:
    """``b``'s windows of two batches; ``cut``: its window holding that batch was discarded just before it."""
    windows: list[tuple[int, ...]] = [(i, i + 1) for i in range(0, BATCHES, 2)]
    if cut is not None and cut % 2 == 1:
        windows[cut // 2] = (cut,)
    return windows


def _mentions_discard(error: BaseException, what: str, rule: str) -> None:
    message = str(error)
    assert "discard" in message, (
        f"{what} raised {message!r}, which does not say to drop the window with discard(wrapper) ({rule})"
    )


# -- WIN-002: an open window's gradients cleared from outside ---------------------------------------------------

_CLEARINGS: dict[str, Callable[[Rig], None]] = {
    "module zero_grad()": lambda rig: rig.halves["a"].zero_grad(),
    "inner optimizer zero_grad()": lambda rig: rig.inner["a"].zero_grad(),
    "a gradient set to None": lambda rig: setattr(next(iter(rig.halves["a"].parameters())), "grad", None),
}


def _finder(rig: Rig, found_by: str, batch_idx: int) -> Callable[[], object]:
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    calls: dict[str, Callable[[], object]] = {
        "step(closure)": lambda: a.step(rig.closure("a", batch_idx, record=False)),
        "step()": lambda: a.step(make_optimizer_step=False),
        "unscale_gradients()": a.unscale_gradients,
        "its own backward()": lambda: a.backward(rig.loss("a", batch_idx, record=False)),
        "another wrapper's backward()": lambda: b.backward(rig.loss("b", batch_idx, record=False)),
    }
    return calls[found_by]


_WIN_002_CASES = [
    ("module zero_grad()", "step(closure)", 1),
    ("module zero_grad()", "its own backward()", 3),
    ("inner optimizer zero_grad()", "unscale_gradients()", 2),
    ("inner optimizer zero_grad()", "another wrapper's backward()", 1),
    ("a gradient set to None", "step()", 3),
    ("a gradient set to None", "step(closure)", 2),
    ("module zero_grad()", "unscale_gradients()", 3),
    ("a gradient set to None", "another wrapper's backward()", 2),
]


@pytest.mark.requirement("WIN-002", "FAIL-009", "FAIL-002", "ACC-001")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.parametrize(
    ("clearing", "found_by", "held"), _WIN_002_CASES, ids=[f"{c}-{f}-{h}" for c, f, h in _WIN_002_CASES]
)
@pytest.mark.varies(
    outside_change=("module zero_grad()", "inner optimizer zero_grad()", "a gradient set to None"),
    found_by=("step(closure)", "step()", "unscale_gradients()", "its own backward()", "another wrapper's backward()"),
    recovery=("discard()",),
    window=("k >= 2 micro-steps", "1 micro-step", "open while another optimizer steps"),
    wrappers=("2",),
    on_failure=("discard", "restore"),
    position=("inside batch()",),
)
def test_gradients_cleared_from_outside_are_refused(
    make_context: MakeContext, cell: Cell, on_failure: str, clearing: str, found_by: str, held: int
) -> None:
    """Wrapper ``a`` holds ``held`` micro-steps of a window of 4; its gradients are cleared outside the wrappers.

    The next call that would use or add to the window raises ``RuntimeError`` that names ``discard``, and changes
    nothing (every gradient, value and outcome as the clearing left them) [WIN-002]; ``discard(a)`` drops the window
    (``DISCARDED``) [FAIL-009], and ``a``'s next window, begun in the same batch, is exact: the plain loop skips the
    batches the window held. Wrapper ``b`` accumulates windows of 2 throughout, untouched.
    """
    rig = Rig(
        make_context,
        cell,
        make_batches(BATCHES, seed=90 + held),
        accumulate_grad_batches=4,
        **failure_settings(on_failure),
    )
    a = rig.wrappers["a"]
    a_closes = {held + 1, BATCHES - 1}
    what = f"after {clearing} with {held} micro-step(s) of a's window held, {found_by}"
    for batch_idx in range(BATCHES):
        with rig.context.batch(batch_idx, is_last=batch_idx == BATCHES - 1):
            if batch_idx == held:
                _CLEARINGS[clearing](rig)
                error = rig.fails(
                    what,
                    "WIN-002: gradients of an open window cleared from outside are found before anything changes",
                    _finder(rig, found_by, batch_idx),
                    raised=RuntimeError,
                )
                _mentions_discard(error, what, "WIN-002")
                rig.context.discard(a)
                assert a.last_outcome is D, f"{what}: discard(a) left last_outcome {a.last_outcome}, expected {D}"
                assert all(p.grad is None for p in rig.halves["a"].parameters()), (
                    f"{what}: discard(a) left gradients on a's parameters (FAIL-009)"
                )
            rig.call("a", batch_idx, make_step=batch_idx in a_closes)
            rig.call("b", batch_idx, make_step=_b_closes(batch_idx))
    rig.train_oracle({"a": [(held, held + 1), tuple(range(held + 2, BATCHES))], "b": _b_windows()})
    rig.assert_oracle(what)


@pytest.mark.requirement("WIN-002", "ZERO-002")
@pytest.mark.cells(devices=EAGER, precisions=("32-true",))
@pytest.mark.varies(
    zero_grad=("with a window open", "of another wrapper"),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    found_by=("step(closure)", "another wrapper's backward()"),
)
def test_what_the_wrappers_do_is_not_taken_for_a_clearing(make_context: MakeContext, cell: Cell) -> None:
    """The wrappers' own calls are never taken for a clearing from outside [WIN-002].

    ``zero_grad()`` of an open window (a no-op, ZERO-002), the other wrapper's ``zero_grad()`` and real steps, its
    backward outside ``step()``: the windows close as planned.
    """
    rig = Rig(make_context, cell, make_batches(BATCHES, seed=95), accumulate_grad_batches=4)
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    for batch_idx in range(BATCHES):
        with rig.context.batch(batch_idx, is_last=batch_idx == BATCHES - 1):
            a.zero_grad()  # a no-op while a's window is open
            rig.call("a", batch_idx, make_step=batch_idx % 4 == 3)
            b.zero_grad()
            rig.call("b", batch_idx, make_step=True, form="backward")
    rig.train_oracle({"a": [(0, 1, 2, 3), (4, 5, 6, 7)], "b": [(i,) for i in range(BATCHES)]})
    rig.assert_oracle("the wrappers' own zero_grad() and steps beside an open window")


# -- WIN-001: an optimizer's parameters changed from outside ----------------------------------------------------


def _change(rig: Rig, change: str, extra: torch.nn.Parameter) -> Callable[[], None]:
    """Make ``change`` to ``a``'s inner optimizer; return what undoes it."""
    groups = rig.inner["a"].param_groups
    if change == "parameter appended to a group":
        groups[0]["params"].append(extra)
        return lambda: groups[0]["params"].pop()
    if change == "parameter popped from a group":
        popped = groups[0]["params"].pop()
        return lambda: groups[0]["params"].append(popped)
    if change == "group appended to param_groups":
        groups.append({**{k: v for k, v in groups[0].items() if k != "params"}, "params": [extra]})

        def drop_group() -> None:
            groups.pop()

        return drop_group
    raise AssertionError(change)


_WIN_001_CASES = [
    ("parameter appended to a group", "step(closure)", "change undone"),
    ("parameter appended to a group", "unscale_gradients()", "discard()"),
    ("parameter popped from a group", "step()", "discard()"),
    ("parameter popped from a group", "step(closure)", "change undone"),
    ("group appended to param_groups", "unscale_gradients()", "change undone"),
    ("group appended to param_groups", "step(closure)", "discard()"),
]


@pytest.mark.requirement("WIN-001", "FAIL-009", "FAIL-002", "ACC-001")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.parametrize("held", [1, 2], ids=["1-held", "2-held"])
@pytest.mark.parametrize(
    ("change", "found_by", "recovery"), _WIN_001_CASES, ids=[f"{c}-{f}-{r}" for c, f, r in _WIN_001_CASES]
)
@pytest.mark.varies(
    outside_change=("parameter appended to a group", "parameter popped from a group", "group appended to param_groups"),
    found_by=("step(closure)", "step()", "unscale_gradients()"),
    recovery=("discard()", "change undone"),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    wrappers=("2",),
)
def test_parameters_changed_mid_window_are_refused(
    make_context: MakeContext, cell: Cell, held: int, change: str, found_by: str, recovery: str
) -> None:
    """Wrapper ``a`` holds ``held`` micro-steps; its inner optimizer's parameters change behind the wrapper's back.

    ``a``'s next ``step()`` or ``unscale_gradients()`` raises ``RuntimeError`` that names ``discard``, before anything
    changes, and so does the call after it while the change stays [WIN-001]. Undone, the window goes on and closes
    exact (the plain loop's window holds every batch); dropped with ``discard(a)``, every gradient of the window goes,
    the popped parameter's included (FAIL-009), and the next window is exact.
    """
    rig = Rig(make_context, cell, make_batches(BATCHES, seed=80 + held), accumulate_grad_batches=4)
    a = rig.wrappers["a"]
    extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(rig.cell), dtype=cell_dtype(rig.cell)))
    what = f"{change} of a's optimizer with {held} micro-step(s) held, then a's {found_by}"
    windows_a: list[tuple[int, ...]] = []
    for batch_idx in range(BATCHES):
        with rig.context.batch(batch_idx, is_last=batch_idx == BATCHES - 1):
            if batch_idx == held:
                a_params = list(rig.halves["a"].parameters())
                undo = _change(rig, change, extra)
                call = _finder(rig, found_by, batch_idx)
                why = "WIN-001: parameters changed while the window is open are refused before anything changes"
                error = rig.fails(what, why, call, raised=RuntimeError)
                _mentions_discard(error, what, "WIN-001")
                rig.fails(f"{what}, called again", why, call, raised=RuntimeError)
                if recovery == "change undone":
                    undo()
                    windows_a.append(tuple(range(held + 2)))
                else:
                    rig.context.discard(a)
                    undo()
                    assert all(p.grad is None for p in a_params), (
                        f"{what}: discard(a) left a gradient on a parameter of the window (FAIL-009: every gradient "
                        "the window holds, those of parameters that left the optimizer mid-window too)"
                    )
                    assert a.last_outcome is D, f"{what}: discard(a) left last_outcome {a.last_outcome}"
                    windows_a.append((held, held + 1))
            rig.call("a", batch_idx, make_step=batch_idx in {held + 1, BATCHES - 1})
            rig.call("b", batch_idx, make_step=_b_closes(batch_idx))
    windows_a.append(tuple(range(held + 2, BATCHES)))
    rig.train_oracle({"a": windows_a, "b": _b_windows()})
    rig.assert_oracle(what)


@pytest.mark.requirement("WIN-001", "ERR-007", "PROXY-003")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.varies(
    outside_change=("add_param_group on the wrapper",),
    param_groups=("added after wrap",),
    window=("k >= 2 micro-steps",),
)
def test_add_param_group_with_a_window_open_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """``add_param_group`` with the wrapper's window open is refused before the inner optimizer changes [WIN-001].

    ``RuntimeError`` naming ``discard``; the inner optimizer keeps its groups, and the window then closes exact.
    """
    rig = Rig(make_context, cell, make_batches(4, seed=83), accumulate_grad_batches=4)
    a = rig.wrappers["a"]
    extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(rig.cell), dtype=cell_dtype(rig.cell)))
    for batch_idx in range(4):
        with rig.context.batch(batch_idx, is_last=batch_idx == 3):
            if batch_idx == 2:
                groups = list(rig.inner["a"].param_groups)
                what = "a.add_param_group({'params': [p]}) with 2 micro-steps of a's window held"
                error = rig.fails(
                    what,
                    "WIN-001: add_param_group with a window open is refused before the inner optimizer changes",
                    lambda: a.add_param_group({"params": [extra]}),
                    raised=RuntimeError,
                )
                _mentions_discard(error, what, "WIN-001")
                assert rig.inner["a"].param_groups == groups, f"{what}: the inner optimizer's groups changed"
            rig.call("a", batch_idx)
    rig.train_oracle({"a": [(0, 1, 2, 3)], "b": []})
    rig.assert_oracle("a window open across a refused add_param_group")


_JOINS = ["parameter appended to a group", "group appended to param_groups", "add_param_group on the wrapper"]


@pytest.mark.requirement("WIN-001", "PROXY-003", "ACC-001")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "64-true", "bf16-true"))
@pytest.mark.parametrize("join", _JOINS)
@pytest.mark.parametrize("found_by", ["step(closure)", "unscale_gradients()"])
@pytest.mark.varies(
    outside_change=(
        "parameter appended to a group",
        "group appended to param_groups",
        "add_param_group on the wrapper",
    ),
    found_by=("step(closure)", "unscale_gradients()"),
    parameters=("unfrozen after wrap",),
    param_groups=("added after wrap",),
    window=("k >= 2 micro-steps",),
)
def test_parameters_added_between_windows_join_the_next(
    make_context: MakeContext, cell: Cell, join: str, found_by: str
) -> None:
    """Parameters added between windows, by hand or by ``add_param_group``, join the next window [WIN-001].

    A frozen last layer is unfrozen after the first window's real step and added to the optimizer; the next window
    holds it and steps it as a plain loop that adds it to its optimizer at the same point (the fine-tuning pattern).
    Windows of 2, the second found by ``step()`` or prepared by ``unscale_gradients()`` first.
    """
    batches = make_batches(6, seed=85)
    device, dtype = cell_device(cell), cell_dtype(cell)
    context = make_context(accumulate_grad_batches=2)
    base = make_model(seed=86)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    head, oracle_head = model[-1], oracle[-1]  # type: ignore[index]
    for module in (head, oracle_head):
        module.requires_grad_(False)
    trunk = [p for p in model.parameters() if p.requires_grad]
    wrapper = context.wrap(torch.optim.SGD(trunk, lr=0.1))
    plain = torch.optim.SGD([p for p in oracle.parameters() if p.requires_grad], lr=0.1)
    for batch_idx, batch in enumerate(batches):
        if batch_idx == 2:  # between windows: the first one stepped at batch 1
            head.requires_grad_(True)
            oracle_head.requires_grad_(True)
            new = list(head.parameters())
            if join == "parameter appended to a group":
                wrapper.optimizer.param_groups[0]["params"].extend(new)
            elif join == "group appended to param_groups":
                wrapper.optimizer.param_groups.append({**wrapper.optimizer.defaults, "params": new})
            else:
                wrapper.add_param_group({"params": new})
            plain.add_param_group({"params": list(oracle_head.parameters())})

        def closure(batch: Any = batch) -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batch, device, dtype)
            wrapper.backward(loss)
            return loss

        closes = batch_idx % 2 == 1
        if closes and found_by == "unscale_gradients()":
            closure()  # the closing micro-step's backward, then the preparation by hand
            wrapper.unscale_gradients()
            wrapper.step(make_optimizer_step=True)
        else:
            wrapper.step(closure, make_optimizer_step=closes)
        (mse(oracle, batch, device, dtype) / 2).backward()
        if closes:
            plain.step()
            plain.zero_grad()
    assert_params_close(model, oracle, cell, f"a last layer joining between windows ({join}, {found_by})")


@pytest.mark.requirement("WIN-001", "ERR-007")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.varies(outside_change=("parameter appended to a group",), tensor_dtypes=("float16",))
def test_a_parameter_joining_between_windows_is_checked_as_wrap_checks(make_context: MakeContext, cell: Cell) -> None:
    """A parameter that joins between windows is checked as ``wrap`` checks it [WIN-001, ERR-007].

    Under 16-mixed a float16 parameter appended to a group between windows is refused at the next ``step()`` with
    ``ValueError``, before anything changes; removed again, the loop goes on.
    """
    rig = Rig(make_context, cell, make_batches(4, seed=87), accumulate_grad_batches=2)
    a = rig.wrappers["a"]
    half = torch.nn.Parameter(torch.zeros(3, device=cell_device(rig.cell), dtype=torch.float16))
    for batch_idx in range(4):
        with rig.context.batch(batch_idx, is_last=batch_idx == 3):
            if batch_idx == 2:
                rig.inner["a"].param_groups[0]["params"].append(half)
                rig.fails(
                    "a's step() after a float16 parameter was appended to its group between windows (16-mixed)",
                    "WIN-001, ERR-007: a joining parameter is checked as wrap checks it, before anything changes",
                    lambda: a.step(rig.closure("a", 2, record=False)),
                    raised=ValueError,
                )
                rig.inner["a"].param_groups[0]["params"].pop()
            rig.call("a", batch_idx)
    rig.train_oracle({"a": [(0, 1), (2, 3)], "b": []})
    rig.assert_oracle("a float16 parameter refused between windows, then removed")


# -- FAIL-009: discard() ----------------------------------------------------------------------------------------


@pytest.mark.requirement("FAIL-009", "AMP-002", "CLIP-002")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("prepared", [False, True], ids=["accumulated", "prepared-by-unscale"])
@pytest.mark.parametrize("held", [0, 1, 3], ids=["empty", "1-held", "3-held"])
@pytest.mark.varies(
    recovery=("discard()",),
    clipping=("unscale_gradients() by hand",),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    wrappers=("2",),
)
def test_discard_drops_the_window(make_context: MakeContext, cell: Cell, prepared: bool, held: int) -> None:
    """``discard(a)`` drops ``a``'s window and nothing else [FAIL-009].

    ``held`` micro-steps in ``a``'s window, and its closing backward (prepared by ``unscale_gradients()`` when asked):
    every gradient of ``a`` is ``None``, ``last_outcome`` is ``DISCARDED``, ``b`` is untouched, and the next window
    starts fresh in the same batch: under 16-mixed it is unscaled once, which the loss scaler's record of the
    discarded one would prevent.
    """
    rig = Rig(make_context, cell, make_batches(BATCHES, seed=70 + held), accumulate_grad_batches=4)
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    cut = held + 1
    for batch_idx in range(BATCHES):
        with rig.context.batch(batch_idx, is_last=batch_idx == BATCHES - 1):
            if batch_idx == held:
                a.backward(rig.loss("a", batch_idx, record=False))
                if prepared:
                    a.unscale_gradients()
                b_grads = [None if p.grad is None else p.grad.clone() for p in rig.halves["b"].parameters()]
                rig.context.discard(a)
                assert a.last_outcome is D, f"discard(a) left last_outcome {a.last_outcome}, expected {D}"
                assert all(p.grad is None for p in rig.halves["a"].parameters()), "discard(a) left a's gradients"
                for p, g in zip(rig.halves["b"].parameters(), b_grads, strict=True):
                    same = p.grad is None if g is None else p.grad is not None and torch.equal(p.grad, g)
                    assert same, "discard(a) changed b's window (FAIL-009 drops the wrapper's window only)"
                assert b.last_outcome in (None, A, S)
            rig.call("a", batch_idx, make_step=batch_idx in {cut, BATCHES - 1})
            rig.call("b", batch_idx, make_step=_b_closes(batch_idx))
    rig.train_oracle({"a": [(held, cut), tuple(range(cut + 1, BATCHES))], "b": _b_windows()})
    rig.assert_oracle(f"discard(a) of a window of {held} micro-step(s){' prepared' if prepared else ''}")


@pytest.mark.requirement("FAIL-009")
@pytest.mark.cells(devices=EAGER, precisions=("32-true",))
@pytest.mark.varies(faults=("invalid argument", "re-entered step"))
def test_discard_refuses_what_it_cannot_drop(make_context: MakeContext, cell: Cell) -> None:
    """``discard()`` refuses what is not its to drop, before anything changes [FAIL-009].

    Anything but a wrapper of the context: ``ValueError``; from inside a ``step()``'s closure: ``RuntimeError``.
    """
    rig = Rig(make_context, cell, make_batches(3, seed=77), accumulate_grad_batches=4)
    a = rig.wrappers["a"]
    other = make_context(accumulate_grad_batches=4)
    stranger_model = other.prepare_module(make_model(seed=78))
    stranger = other.wrap(torch.optim.SGD(stranger_model.parameters(), lr=0.1))
    x, y = make_batches(1, seed=79)[0]
    stranger.backward(mse(stranger_model, (x, y), cell_device(rig.cell), cell_dtype(rig.cell)))
    stranger.step()  # the other context's window holds a micro-step
    held = [p.grad.clone() for p in stranger_model.parameters() if p.grad is not None]
    with rig.context.batch(0):
        rig.call("a", 0)
        for given, name in [(rig.inner["a"], "its inner optimizer"), (stranger, "another context's wrapper")]:
            rig.fails(
                f"discard({name})",
                "FAIL-009: discard() takes a wrapper of this context",
                partial(rig.context.discard, given),
                raised=ValueError,
            )
            now = [p.grad for p in stranger_model.parameters()]
            kept = len(now) == len(held) and all(
                g is not None and torch.equal(g, h) for g, h in zip(now, held, strict=True)
            )
            assert kept, f"discard({name}), refused, changed the other context's window (FAIL-009)"
            assert stranger.last_outcome is A, f"discard({name}), refused, changed the other wrapper's outcome"

        def closure() -> torch.Tensor:
            loss = rig.closure("a", 1, record=False)()
            rig.context.discard(a)
            return loss

        with refuses(RuntimeError, "discard(a) from a's closure", "FAIL-009: discard() while a step() runs"):
            a.step(closure)
    rig.call("a", 1)
    assert a.last_outcome is A, f"a's window after the refused discard(): {a.last_outcome}"
