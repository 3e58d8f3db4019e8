"""Checks of bad input: a clear error, raised before anything changes."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_unchanged, grads, snapshot, state_diff
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    Halves,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    refuses,
    run_steps,
    untrained_dtypes,
)
from lightning_optimizer.conformance.oracles import oracle_copy, oracle_mean_steps
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]


def _open_window(make_context: MakeContext, cell: Cell) -> tuple[torch.nn.Module, Any, list[torch.Tensor | None]]:
    """A wrapper with one accumulated micro-step (``accumulate_grad_batches=2``), and its gradients."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: False)
    return model, wrapper, grads(model.parameters())


def _assert_window_intact(model: torch.nn.Module, wrapper: Any, held: list[torch.Tensor | None], what: str) -> None:
    """The open window's gradients and outcome as they were, and it still closes on time."""
    assert_same_grads(grads(model.parameters()), held, what)
    before = wrapper.last_outcome
    assert before is StepOutcome.ACCUMULATED, f"{what} changed the outcome to {before}"
    wrapper.step(make_optimizer_step=None)
    after = wrapper.last_outcome
    assert after is StepOutcome.STEPPED, f"after {what} the open window no longer closes on time"


@pytest.mark.requirement("ERR-001")
@pytest.mark.parametrize("closure", [3, "loss", [lambda: None]], ids=["int", "str", "list"])
@pytest.mark.varies(faults=("invalid argument",), window=("k >= 2 micro-steps",))
def test_non_callable_closure(make_context: MakeContext, cell: Cell, closure: object) -> None:
    """A closure that is not callable raises ``TypeError`` and changes nothing, whatever else the call would refuse.

    The second call would also be refused for the window's stage (a ``False`` step after ``unscale_gradients()``,
    CLIP-002): the argument is checked first, so the error is still the ``TypeError``.
    """
    model, wrapper, held = _open_window(make_context, cell)
    why = "ERR-001: a closure that is not callable is refused with TypeError before anything runs"
    with refuses(TypeError, f"wrapper.step({closure!r}) with a window open", why):
        wrapper.step(closure)
    _assert_window_intact(model, wrapper, held, f"step(closure={closure!r})")
    model, wrapper, _ = _open_window(make_context, cell)
    wrapper.unscale_gradients()
    prepared = grads(model.parameters())
    call = f"wrapper.step({closure!r}, make_optimizer_step=False) after unscale_gradients()"
    with refuses(TypeError, call, why + ", before the window's stage is"):
        wrapper.step(closure, make_optimizer_step=False)
    assert_same_grads(grads(model.parameters()), prepared, f"{call} changed the prepared gradients")
    wrapper.step()
    assert wrapper.last_outcome is StepOutcome.STEPPED, f"after {call} the prepared window did not step"


@pytest.mark.requirement("ERR-002")
@pytest.mark.parametrize("value", [1, 0, "yes", 1.0, torch.tensor(True)], ids=["1", "0", "yes", "1.0", "tensor"])
@pytest.mark.varies(faults=("invalid argument",), window=("k >= 2 micro-steps",))
def test_non_bool_make_optimizer_step(make_context: MakeContext, cell: Cell, value: object) -> None:
    """A ``make_optimizer_step`` that is not a ``bool`` or ``None`` raises ``TypeError`` and changes nothing."""
    model, wrapper, held = _open_window(make_context, cell)
    calls = []
    with refuses(
        TypeError,
        f"wrapper.step(closure, make_optimizer_step={value!r}) with a window open",
        "ERR-002: a make_optimizer_step that is not a bool or None is refused before anything runs",
    ):
        wrapper.step(lambda: calls.append(1), make_optimizer_step=value)
    assert calls == [], "the closure ran although make_optimizer_step was invalid"
    _assert_window_intact(model, wrapper, held, f"make_optimizer_step={value!r}")


@pytest.mark.requirement("CTX-001")
@pytest.mark.parametrize("value", [0, -1, 2.0, True, "2"], ids=["0", "-1", "2.0", "True", "str"])
@pytest.mark.varies(faults=("invalid argument",))
def test_invalid_accumulate_grad_batches(make_context: MakeContext, cell: Cell, value: object) -> None:
    """``accumulate_grad_batches`` that is not a positive ``int`` is refused at construction."""
    with refuses(
        (TypeError, ValueError),
        f"factory(cell, accumulate_grad_batches={value!r})",
        "CTX-001: accumulate_grad_batches is a positive int, anything else is refused at construction",
    ):
        make_context(accumulate_grad_batches=value)
    for fine in (1, 3):  # the refusal is of the value: a valid one is accepted
        make_context(accumulate_grad_batches=fine)


@pytest.mark.requirement("ERR-003")
@pytest.mark.parametrize(("field", "value"), [("precision", "fp17"), ("device", "tpu")])
@pytest.mark.varies(faults=("invalid argument",))
def test_unknown_precision_or_device(
    implementation: ImplementationInfo[Any], cell: Cell, field: str, value: str
) -> None:
    """An unknown precision or device name raises ``ValueError`` naming the valid ones."""
    name: Any = value  # deliberately outside the Literal types
    bad = dataclasses.replace(cell, precision=name) if field == "precision" else dataclasses.replace(cell, device=name)
    with refuses(
        ValueError,
        f"factory(cell) for a cell with {field}={value!r}",
        "ERR-003: an unknown precision or device name is refused with ValueError naming the valid ones",
    ) as raised:
        implementation.factory(bad)
    valid = "32-true" if field == "precision" else "cpu"
    assert valid in str(raised.value), f"the error does not list the valid names: {raised.value}"


@pytest.mark.requirement("ERR-004")
@pytest.mark.varies(faults=("invalid argument",), wrappers=("1",))
def test_wrapping_a_wrapper(make_context: MakeContext, cell: Cell) -> None:
    """Wrapping a wrapper raises ``TypeError``."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    why = "ERR-004: wrapping an object that is already a wrapper is refused with TypeError"
    with refuses(TypeError, "context.wrap(wrapper) of a wrapper that this context made", why):
        context.wrap(wrapper)  # type: ignore[type-var]
    with refuses(TypeError, "another context's wrap(wrapper) of a wrapper that the first context made", why):
        make_context().wrap(wrapper)  # type: ignore[type-var]


@pytest.mark.requirement("ERR-005")
@pytest.mark.varies(faults=("refused load",), optimizer=("Adam",))
def test_state_dict_of_another_layout(make_context: MakeContext, cell: Cell) -> None:
    """A state dict for another parameter layout raises ``ValueError``; the inner state is unchanged."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    before = copy.deepcopy(wrapper.optimizer.state_dict())
    other = torch.optim.Adam(list(make_model().parameters())[:2], lr=0.1)
    with refuses(
        ValueError,
        "wrapper.load_state_dict(state) of an Adam over 2 of the wrapper's 4 parameters",
        "ERR-005: a state dict for another parameter layout is refused and leaves the inner state unchanged",
    ):
        wrapper.load_state_dict(other.state_dict())
    problem = state_diff(wrapper.optimizer.state_dict(), before)
    assert problem is None, f"a refused load changed the inner state: {problem}"


_MALFORMED_STATES: list[tuple[str, object, type[Exception], tuple[str, ...]]] = [
    ("{}", {}, ValueError, ("state", "param_groups")),
    ("a state without 'param_groups'", "no-groups", ValueError, ("param_groups",)),
    ("a state without 'state'", "no-state", ValueError, ("state",)),
    ("a dict of other keys", {"windows": [], "scaler": None}, ValueError, ("state", "param_groups")),
    ("None", None, TypeError, ()),
    ("a list", [], TypeError, ()),
]


@pytest.mark.requirement("ERR-005")
@pytest.mark.parametrize(
    ("what", "given", "raised", "named"), _MALFORMED_STATES, ids=[case[0] for case in _MALFORMED_STATES]
)
@pytest.mark.varies(faults=("refused load",), optimizer=("SGD",), window=("k >= 2 micro-steps",))
def test_a_malformed_optimizer_state_is_refused(
    make_context: MakeContext, cell: Cell, what: str, given: object, raised: type[Exception], named: tuple[str, ...]
) -> None:
    """An optimizer state that is not a dict, or lacks torch's keys, is refused by our error, before anything changes.

    ``TypeError`` for a non-dict, ``ValueError`` naming each missing key (``"state"``, ``"param_groups"``) otherwise
    (torch's own would be ``KeyError('param_groups')``); the inner state and an open window are as they were.
    """
    model, wrapper, held = _open_window(make_context, cell)
    full = wrapper.optimizer.state_dict()
    parts = {"no-groups": {"state": full["state"]}, "no-state": {"param_groups": full["param_groups"]}}
    state = parts[given] if isinstance(given, str) else given
    before = copy.deepcopy(full)
    with refuses(
        raised,
        f"wrapper.load_state_dict({what})",
        "ERR-005: a malformed optimizer state is refused with our error before anything changes",
    ) as error:
        wrapper.load_state_dict(state)
    message = str(error.value)
    missing = [key for key in named if repr(key) not in message and f'"{key}"' not in message]
    assert not missing, f"wrapper.load_state_dict({what}) raised {message!r}, which does not name {missing} (ERR-005)"
    problem = state_diff(wrapper.optimizer.state_dict(), before)
    assert problem is None, f"a refused load of {what} changed the inner state: {problem}"
    _assert_window_intact(model, wrapper, held, f"wrapper.load_state_dict({what})")


_BAD_STEP = (
    "ERR-001, ERR-002: a closure that is not callable, or a make_optimizer_step that is not a bool or None, is "
    "refused with TypeError before anything runs"
)


@pytest.mark.requirement("ERR-001", "ERR-002", "STEP-004")
# The checks and windows work alike on every device; on XLA the two halves' steps would only add compile time.
@pytest.mark.cells(devices=("cpu", "cuda"))
@pytest.mark.varies(
    wrappers=("2",),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    faults=("invalid argument",),
    outcome_read=("after every call of every wrapper",),
)
def test_bad_arguments_leave_both_windows(make_context: MakeContext, cell: Cell) -> None:
    """With two windows open, a refused ``step`` of either changes nothing of either window; both close on time."""
    context, base = make_context(accumulate_grad_batches=2), Halves(41, 42)
    oracle, model = oracle_copy(base, cell), context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    halves = {"a": model.a, "b": model.b}
    wrappers = {name: context.wrap(torch.optim.SGD(half.parameters(), lr=0.1)) for name, half in halves.items()}
    batches = make_batches(2, seed=3)
    calls: list[str] = []

    def closure_for(name: str, batch_idx: int) -> Callable[[], None]:
        def closure() -> None:
            calls.append(name)
            with context.autocast():
                loss = mse(halves[name], batches[batch_idx], cell_device(cell), cell_dtype(cell)) * LOSS_FACTOR
            wrappers[name].backward(loss)

        return closure

    with context.batch(0):
        for name in halves:
            wrappers[name].step(closure_for(name, 0))
    before = snapshot(model)
    with context.batch(1):
        for name, other in (("a", "b"), ("b", "a")):
            bad: list[tuple[str, dict[str, Any]]] = [
                ("closure=3", {"closure": 3}),
                ("make_optimizer_step='yes'", {"closure": closure_for(name, 1), "make_optimizer_step": "yes"}),
                ("make_optimizer_step=1", {"closure": closure_for(name, 1), "make_optimizer_step": 1}),
            ]
            # The other wrapper's outcome as it is now (after its own refused calls, its value is left open).
            others_outcome = wrappers[other].last_outcome
            for what, arguments in bad:
                calls.clear()
                with refuses(TypeError, f"wrapper {name}'s step({what}) with both windows open", _BAD_STEP):
                    wrappers[name].step(**arguments)
                assert calls == [], f"wrapper {name}'s step({what}): a closure ran"
                assert wrappers[other].last_outcome is others_outcome, (
                    f"wrapper {name}'s step({what}) changed wrapper {other}'s last_outcome from {others_outcome} to "
                    f"{wrappers[other].last_outcome}"
                )
            refused = ", ".join(what for what, _ in bad)
            assert_unchanged(model, before, f"wrapper {name}'s refused calls ({refused}), with both windows open")
        for name in halves:
            wrappers[name].step(closure_for(name, 1))
            assert wrappers[name].last_outcome is StepOutcome.STEPPED, (
                f"after refused calls, wrapper {name}'s window did not close on time: {wrappers[name].last_outcome}"
            )

    # The oracle: each half one SGD step on the mean of its two micro-batches, one scaler for both.
    oracle_mean_steps([oracle.a, oracle.b], batches, cell, 0.1, LOSS_FACTOR)
    assert_params_close(model, oracle, cell, "two windows that closed after refused calls")


def _wrong_parameters(cell: Cell) -> list[tuple[str, torch.nn.Parameter]]:
    """Floating-point parameters that a context of ``cell`` must refuse: dtypes it does not train, another device.

    32-true and bf16-mixed train every floating-point dtype (ERR-007): there only another device is wrong.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    wrong = [(device, other) for other in untrained_dtypes(cell)]
    elsewhere = "cpu" if cell.device != "cpu" else "cuda" if torch.cuda.is_available() else None
    wrong += [] if elsewhere is None else [(torch.device(elsewhere), dtype)]
    return [(f"a {t} parameter on {d}", torch.nn.Parameter(torch.ones(3, device=d, dtype=t))) for d, t in wrong]


_OFF_THE_CONTEXT = "ERR-007: a parameter off the context's device or dtype is refused with ValueError"


@pytest.mark.requirement("ERR-007", "PROXY-003")
@pytest.mark.varies(
    param_groups=("1", "2 with other hyper-parameters", "added after wrap"), faults=("invalid argument",)
)
def test_parameters_off_the_context_device_or_dtype(make_context: MakeContext, cell: Cell) -> None:
    """``wrap`` and ``add_param_group`` refuse a parameter off the device or dtype, before anything changes."""
    context = make_context()
    model = context.prepare_module(make_model())
    device, dtype = cell_device(cell), cell_dtype(cell)
    wrong = _wrong_parameters(cell)
    for what, parameter in wrong:
        groups: list[tuple[str, list[dict[str, Any]]]] = [
            ("alone", [{"params": [parameter]}]),
            ("in a second group", [{"params": list(model.parameters())}, {"params": [parameter], "lr": 0.01}]),
        ]
        for where, param_groups in groups:
            with refuses(ValueError, f"wrap of an optimizer holding {what} {where}", _OFF_THE_CONTEXT):
                context.wrap(torch.optim.SGD(param_groups, lr=0.1))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    inner = wrapper.optimizer
    groups_before = list(inner.param_groups)
    params_before = [list(group["params"]) for group in groups_before]
    fine = torch.nn.Parameter(torch.ones(3, device=device, dtype=dtype))
    for what, parameter in wrong:
        refused: list[tuple[str, dict[str, Any]]] = [
            ("alone", {"params": [parameter]}),
            ("after a fitting one", {"params": [fine, parameter], "lr": 0.01}),
            ("as a bare tensor", {"params": parameter}),
        ]
        for where, group in refused:
            shown = f"add_param_group of {what} {where}"
            with refuses(ValueError, shown, _OFF_THE_CONTEXT):
                wrapper.add_param_group(group)
            assert len(inner.param_groups) == len(groups_before) and all(
                got is want and list(got["params"]) == params
                for got, want, params in zip(inner.param_groups, groups_before, params_before, strict=True)
            ), f"{shown} was refused, but the inner optimizer's param_groups changed"
    wrapper.add_param_group({"params": (p for p in [fine]), "lr": 0.5})  # a one-shot iterable, as torch allows
    assert len(inner.param_groups) == 2, f"a valid add_param_group left {len(inner.param_groups)} groups, not 2"
    added = inner.param_groups[1]["params"]
    assert len(added) == 1 and added[0] is fine, f"the added group holds {len(added)} parameters, not the one given"
    batch = make_batches(1)[0]

    def closure() -> None:
        with context.autocast():
            # (a gradient of fine.sum() would be an expanded tensor, which torch_xla 2.9 mis-scales in place)
            loss = mse(model, batch, device, dtype) * LOSS_FACTOR + (fine * fine).sum() / 2
        wrapper.backward(loss)

    wrapper.step(closure, make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED, f"the step with the added group: {wrapper.last_outcome}"
    want = torch.full((3,), 0.5, dtype=dtype)  # 1 - lr 0.5 x gradient 1 (a power-of-two scale unscales exactly)
    assert torch.equal(fine.detach().cpu(), want), f"the added group's parameter is {fine.tolist()}, not 0.5s"
    assert fine.grad is None, "the added group's gradient survived the real step"
