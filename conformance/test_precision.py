"""Checks of what each precision does to the module and to the forward pass [PREC-001, PREC-002, ERR-007].

The module's dtypes are what Lightning's precision plugins leave: 64-true as ``module.double()``, bf16-true and 16-true
as ``module.to(dtype)`` (a module holding a complex tensor refused first), 32-true and the mixed precisions as the
module was built. Each check's oracle is written beside it: ``module.double()`` or ``module.to(dtype)`` applied to a
copy by the check itself, or the dtypes spelled out by hand, and a plain PyTorch loop over that copy.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.harness import (
    TRAINED_DTYPES,
    TRUE_DTYPES,
    Batch,
    adam_eps,
    cell_device,
    cell_dtype,
    context_loss,
    make_batches,
    make_model,
    refuses,
    tolerance_for,
    untrained_dtypes,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import oracle_loss, plain_scaler, train_windows
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
TRUE_PRECISIONS = ("64-true", "32-true", "bf16-true", "16-true")
CONVERTING_NOTHING = ("32-true", "bf16-mixed", "16-mixed")
"""The precisions whose ``prepare_module`` converts no dtype [PREC-001]."""
HALF_TRUE = ("bf16-true", "16-true")


@pytest.mark.requirement("PREC-001", "PREC-002")
@pytest.mark.cells(precisions=TRUE_PRECISIONS)
@pytest.mark.varies(modules=("1 prepared module",))
def test_true_precision_has_no_autocast(make_context: MakeContext, cell: Cell) -> None:
    """The true precisions open no autocast: a float32 model's parameters and forward are in the precision's dtype.

    64-true, bf16-true and 16-true cast the float32 model to float64, bfloat16 and float16; 32-true keeps it float32.
    """
    context = make_context()
    model = context.prepare_module(make_model())
    want = TRUE_DTYPES.get(cell.precision, torch.float32)
    dtypes = {param.dtype for param in model.parameters()}
    assert dtypes == {want}, f"{cell.precision}: prepare_module left parameters in {sorted(map(str, dtypes))}"
    x = torch.randn(3, 4, dtype=want, device=next(model.parameters()).device)
    with context.autocast():
        out = model(x)
        enabled = torch.is_autocast_enabled(x.device.type)
    assert not enabled, f"{cell.precision}: autocast is enabled inside context.autocast()"
    assert out.dtype == want, f"{cell.precision}: the forward pass computed in {out.dtype}"


# -- the modules: every kind of tensor the rules speak of ----------------------------------------------------------


class Body(torch.nn.Module):
    """A nested submodule: the suite's float32 MLP, then BatchNorm (float statistics, an int64 count)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.mlp = make_model(seed=seed)
        self.norm = torch.nn.BatchNorm1d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP, then BatchNorm."""
        out: torch.Tensor = self.norm(self.mlp(x))
        return out


class Tensors(torch.nn.Module):
    """A module of every dtype PREC-001 and PREC-002 name, each used by ``forward`` (so trained, or read).

    ``body`` (nested: float32 Linear layers, BatchNorm); a float64 parameter ``gain`` and buffer ``shift``; a
    bfloat16 parameter ``low`` (with ``low_dtypes``, else float32); an int64 buffer ``calls`` counting the training
    forwards; a complex64 buffer ``phase`` (``complex_buffer``) and a complex64 parameter ``rotation``
    (``complex_parameter``), in forward through their real parts.
    """

    def __init__(
        self, seed: int, *, complex_buffer: bool = False, complex_parameter: bool = False, low_dtypes: bool = True
    ) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.body = Body(seed)
        self.gain = torch.nn.Parameter(1.0 + 0.1 * torch.randn(2, generator=generator, dtype=torch.float64))
        self.register_buffer("shift", 0.1 * torch.randn(2, generator=generator, dtype=torch.float64))
        low = 0.1 * torch.randn(2, generator=generator)
        self.low = torch.nn.Parameter(low.to(torch.bfloat16) if low_dtypes else low)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        parts = torch.randn(2, 2, generator=generator)
        phase = torch.complex(parts[0], parts[1]) if complex_buffer else None
        self.register_buffer("phase", phase)  # None: no buffer (named_buffers leaves it out)
        rotation = torch.nn.Parameter(torch.complex(parts[1], parts[0]) * 0.5) if complex_parameter else None
        self.register_parameter("rotation", rotation)

    calls: torch.Tensor
    shift: torch.Tensor
    phase: torch.Tensor | None
    rotation: torch.nn.Parameter | None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output, scaled by ``gain`` and shifted by the rest, in the body's dtype; ``calls`` counted."""
        out = self.body(x)
        dtype = out.dtype
        out = out * self.gain.to(dtype) + self.shift.to(dtype) + self.low.to(dtype)
        if self.phase is not None:
            out = out + self.phase.real.to(dtype)
        if self.rotation is not None:
            turned = self.rotation if self.phase is None else self.rotation * self.phase
            out = out + turned.real.to(dtype)
        if self.training:
            self.calls.add_(1)
        result: torch.Tensor = out
        return result


def _named(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by qualified name (a wrapper's ``module.`` prefix dropped)."""
    named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    return {re.sub(r"^(module\.)+", "", name): tensor for name, tensor in named.items()}


def _listing(tensors: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{name}: {str(tensor.dtype).removeprefix('torch.')}" for name, tensor in sorted(tensors.items()))


def _assert_dtypes(module: torch.nn.Module, want: dict[str, torch.dtype], what: str) -> None:
    """Each parameter and buffer of ``module`` in the dtype ``want`` names for it (and no tensor more or less)."""
    got = {name: tensor.dtype for name, tensor in _named(module).items()}
    assert set(got) == set(want), f"{what}: the module holds {sorted(got)}, expected {sorted(want)}"
    wrong = {name: (dtype, want[name]) for name, dtype in got.items() if dtype != want[name]}
    assert not wrong, f"{what}: " + "; ".join(
        f"{name} is {str(dtype).removeprefix('torch.')}, expected {str(need).removeprefix('torch.')}"
        for name, (dtype, need) in sorted(wrong.items())
    )


def _real(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU float64 view of a tensor's values, a complex one as its real and imaginary parts."""
    cpu = tensor.detach().cpu()
    return torch.view_as_real(cpu).double() if cpu.is_complex() else cpu.double()


def _assert_tensors(got: torch.nn.Module, want: torch.nn.Module, cell: Cell, what: str, *, exact: bool) -> None:
    """Every parameter and buffer of ``got`` equal to ``want``'s (``exact``: bit for bit), dtypes included."""
    mine, theirs = _named(got), _named(want)
    assert set(mine) == set(theirs), f"{what}: the module holds {sorted(mine)}, the oracle {sorted(theirs)}"
    tol = tolerance_for(cell)
    for name, tensor in sorted(mine.items()):
        other = theirs[name]
        assert tensor.dtype == other.dtype, f"{what}: {name} is {tensor.dtype}, the oracle's {other.dtype}"
        if exact:
            same = torch.equal(tensor.detach().cpu(), other.detach().cpu())
        else:
            a, b = _real(tensor), _real(other)
            assert bool(torch.isfinite(b).all()), f"{what}: the oracle's {name} is not finite (the check's inputs)"
            same = torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol)
        assert same, (
            f"{what}: {name} differs from the plain-PyTorch oracle on {cell.id} ({'bit for bit' if exact else tol})"
        )


def _assert_on(module: torch.nn.Module, device: torch.device, what: str) -> None:
    elsewhere = {name: str(t.device) for name, t in _named(module).items() if t.device.type != device.type}
    assert not elsewhere, f"{what}: tensors off {device.type}: {elsewhere}"


def scaler_unscales(cell: Cell, dtype: torch.dtype) -> bool:
    """Whether the cell's loss scaler can unscale gradients of ``dtype`` (always, where the cell has none).

    On XLA, torch_xla 2.9's ``GradScaler`` unscale of float64 or bfloat16 gradients multiplies them by its float32
    inverse scale, a mixed-precision multiply that XLA's verifier refuses: the plain loop fails alike. There the
    checks show that 16-mixed wraps such parameters (ERR-007) and keeps their dtypes, but train its float32 ones only.
    """
    return cell.device != "xla" or cell.precision != "16-mixed" or dtype == torch.float32


def _freeze_unscalable(module: torch.nn.Module, cell: Cell) -> None:
    """Freeze the parameters whose gradients the cell's loss scaler cannot unscale (:func:`scaler_unscales`)."""
    for param in module.parameters():
        if param.is_floating_point() and not scaler_unscales(cell, param.dtype):
            param.requires_grad_(False)


WINDOWS = [[0, 1], [2]]
"""``accumulate_grad_batches=2`` over three batches: a full window, then the last batch's, flushed."""
LR = 1.0


def _train(context: TrainingContext, model: torch.nn.Module, cell: Cell, batches: Sequence[Batch]) -> None:
    """Three batches of SGD (momentum) over every parameter, in the closure form; windows ``WINDOWS``."""
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9))
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

            def closure(batch: Batch = batch) -> None:
                wrapper.backward(context_loss(context, model, batch, cell))

            wrapper.step(closure)
        assert wrapper.last_outcome is (StepOutcome.ACCUMULATED if batch_idx == 0 else StepOutcome.STEPPED), (
            f"batch {batch_idx}: {wrapper.last_outcome}"
        )


def _plain(oracle: torch.nn.Module, cell: Cell, batches: Sequence[Batch]) -> None:
    """The plain loop of :func:`_train` over the oracle's copy (autocast and a GradScaler where the cell has them)."""
    optimizer = torch.optim.SGD(oracle.parameters(), lr=LR, momentum=0.9)
    train_windows(cell, oracle, optimizer, batches, WINDOWS, plain_scaler(cell), accumulate=2)


# -- PREC-001: 64-true casts as module.double(); 32-true and the mixed precisions convert nothing ---------------


@pytest.mark.requirement("PREC-001", "ERR-007")
@pytest.mark.cells(precisions=("64-true",))
@pytest.mark.varies(
    modules=("1 prepared module", "nested submodules", "BatchNorm", "buffers"),
    tensor_dtypes=("float64", "float32", "bfloat16", "complex", "integer"),
    window=("k >= 2 micro-steps", "partial, flushed by the last batch"),
)
def test_64_true_casts_floating_tensors_as_double_does(make_context: MakeContext, cell: Cell) -> None:
    """64-true: floating-point parameters and buffers to float64, complex and integer ones kept; then it trains.

    The oracle is ``module.double()`` of a copy, moved to the cell's device: each tensor's dtype and value after
    ``prepare_module``, then after three batches of training (the complex parameter included) those of the plain
    loop over it. The dtypes are spelled out by hand as well.
    """
    base = Tensors(71, complex_buffer=True, complex_parameter=True)
    oracle = copy.deepcopy(base).double().to(cell_device(cell))  # Lightning's DoublePrecision: module.double()
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(base)
    by_hand = {name: torch.float64 for name in _named(oracle)}
    by_hand |= {"calls": torch.int64, "body.norm.num_batches_tracked": torch.int64}
    by_hand |= {"phase": torch.complex64, "rotation": torch.complex64}
    _assert_dtypes(model, by_hand, "64-true's prepare_module (PREC-001: floating tensors to float64, others kept)")
    _assert_tensors(model, oracle, cell, "64-true's prepare_module against module.double()", exact=True)
    _assert_on(model, cell_device(cell), "64-true's prepare_module")
    batches = make_batches(3, seed=72)
    _train(context, model, cell, batches)
    _plain(oracle, cell, batches)
    _assert_tensors(model, oracle, cell, "three batches of 64-true training", exact=False)


@pytest.mark.requirement("PREC-001", "ERR-007")
@pytest.mark.cells(precisions=CONVERTING_NOTHING)
@pytest.mark.varies(
    modules=("1 prepared module", "nested submodules", "BatchNorm", "buffers"),
    tensor_dtypes=("float64", "float32", "bfloat16", "complex", "integer"),
    window=("k >= 2 micro-steps", "partial, flushed by the last batch"),
    loss_scale=("initial",),
)
def test_32_true_and_mixed_precisions_convert_nothing(make_context: MakeContext, cell: Cell) -> None:
    """32-true and the mixed precisions keep every dtype as built: float64, bfloat16 and complex included.

    ``wrap`` takes the float64 and bfloat16 parameters (ERR-007), and the module trains as the plain loop trains a
    copy of it left as built (autocast and a GradScaler where the cell has them; on XLA under 16-mixed its float32
    parameters only, :func:`scaler_unscales`). The dtypes are spelled out by hand.
    """
    base = Tensors(73, complex_buffer=True)
    by_hand = {name: torch.float32 for name in _named(base)}
    by_hand |= {"gain": torch.float64, "shift": torch.float64, "low": torch.bfloat16, "phase": torch.complex64}
    by_hand |= {"calls": torch.int64, "body.norm.num_batches_tracked": torch.int64}
    _freeze_unscalable(base, cell)
    oracle = copy.deepcopy(base).to(cell_device(cell))  # moved, not cast
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(base)
    what = f"{cell.precision}'s prepare_module (PREC-001: converts nothing)"
    _assert_dtypes(model, by_hand, what)
    _assert_tensors(model, oracle, cell, what, exact=True)
    _assert_on(model, cell_device(cell), what)
    batches = make_batches(3, seed=74)
    _train(context, model, cell, batches)
    _plain(oracle, cell, batches)
    _assert_dtypes(model, by_hand, f"{cell.precision} after training")
    _assert_tensors(model, oracle, cell, f"three batches of {cell.precision} training", exact=False)


# -- PREC-002: bf16-true and 16-true cast as module.to(dtype), refusing complex tensors first ----------------------


def _complex_buffer() -> torch.nn.Module:
    return Tensors(75, complex_buffer=True, low_dtypes=False)


def _complex_parameter() -> torch.nn.Module:
    outer = torch.nn.Module()
    outer.inner = Tensors(76, complex_parameter=True)  # nested: inner.rotation
    return outer


def _complex_beside_batch_norm() -> torch.nn.Module:
    net = torch.nn.Sequential(make_model(seed=77), torch.nn.BatchNorm1d(2))
    net[1].register_buffer("spectrum", torch.complex(torch.ones(2), torch.arange(2.0)))
    return net


COMPLEX_MODULES: dict[str, tuple[Callable[[], torch.nn.Module], str]] = {
    "complex buffer": (_complex_buffer, "phase"),
    "nested complex parameter": (_complex_parameter, "rotation"),
    "complex buffer beside BatchNorm": (_complex_beside_batch_norm, "spectrum"),
}
"""A module holding a complex tensor, and that tensor's name (what the refusal must name)."""


def _state_of(module: torch.nn.Module) -> dict[str, tuple[torch.dtype, str, torch.Tensor]]:
    return {name: (t.dtype, str(t.device), t.detach().clone()) for name, t in _named(module).items()}


@pytest.mark.requirement("PREC-002")
@pytest.mark.cells(precisions=HALF_TRUE)
@pytest.mark.parametrize("holding", list(COMPLEX_MODULES))
@pytest.mark.varies(
    modules=("1 prepared module", "nested submodules", "BatchNorm", "buffers"),
    tensor_dtypes=("complex", "float64", "float32", "integer"),
    faults=("invalid argument",),
)
def test_half_true_refuses_complex_tensors_before_anything_changes(
    make_context: MakeContext, cell: Cell, holding: str
) -> None:
    """bf16-true and 16-true refuse a module holding a complex tensor: ``ValueError`` naming it, the module unchanged.

    ``module.to(dtype)`` would discard the imaginary part. Unchanged: every tensor's dtype, device and value (bit for
    bit), the complex one and the floating ones the cast would have changed. The same context then prepares a
    module without complex tensors.
    """
    build, name = COMPLEX_MODULES[holding]
    module = build()
    before = _state_of(module)
    context = make_context()
    with refuses(
        ValueError,
        f"prepare_module of a module holding a {holding} ({name!r}) in {cell.precision}",
        "PREC-002: a complex parameter or buffer is refused, named, before anything changes",
        match=rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])",
    ):
        context.prepare_module(module)
    after = _state_of(module)
    assert set(after) == set(before), f"the refused prepare_module changed the module's tensors: {sorted(after)}"
    for key, (dtype, device, value) in before.items():
        now_dtype, now_device, now = after[key]
        assert (now_dtype, now_device) == (dtype, device), (
            f"the refused prepare_module left {key} as {now_dtype} on {now_device}, it was {dtype} on {device} "
            "(PREC-002: refused before anything changes)"
        )
        assert torch.equal(now, value), f"the refused prepare_module changed the values of {key}"
    model = context.prepare_module(make_model(seed=78))
    dtypes = {param.dtype for param in model.parameters()}
    assert dtypes == {cell_dtype(cell)}, f"after the refusal, prepare_module cast a model to {dtypes}"


@pytest.mark.requirement("PREC-002", "ERR-007")
@pytest.mark.cells(precisions=HALF_TRUE)
@pytest.mark.varies(
    modules=("1 prepared module", "nested submodules", "BatchNorm", "buffers"),
    tensor_dtypes=("float64", "float32", "bfloat16", "integer"),
    window=("k >= 2 micro-steps", "partial, flushed by the last batch"),
)
def test_half_true_casts_as_module_to_does(make_context: MakeContext, cell: Cell) -> None:
    """bf16-true and 16-true cast every floating-point tensor as ``module.to(dtype)``; integer ones are kept.

    The oracle is ``module.to(dtype)`` of a copy (float64, float32 and bfloat16 tensors; BatchNorm's statistics and
    its count; a nested submodule), compared bit for bit; then three batches of training against the plain loop.
    """
    dtype = TRUE_DTYPES[cell.precision]
    base = Tensors(79)
    oracle = copy.deepcopy(base).to(dtype).to(cell_device(cell))  # Lightning's HalfPrecision: module.to(dtype)
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(base)
    by_hand = {name: dtype for name in _named(oracle)} | {
        "calls": torch.int64,
        "body.norm.num_batches_tracked": torch.int64,
    }
    what = f"{cell.precision}'s prepare_module (PREC-002: as module.to({dtype}))"
    _assert_dtypes(model, by_hand, what)
    _assert_tensors(model, oracle, cell, f"{what}, against module.to({dtype})", exact=True)
    _assert_on(model, cell_device(cell), what)
    batches = make_batches(3, seed=80)
    _train(context, model, cell, batches)
    _plain(oracle, cell, batches)
    _assert_tensors(model, oracle, cell, f"three batches of {cell.precision} training", exact=False)


# -- PREC-002: 16-true is float16 without autocast, loss scaling or skipped steps ----------------------------------


@pytest.mark.requirement("PREC-002")
@pytest.mark.cells(precisions=HALF_TRUE)
@pytest.mark.varies(optimizer=("Adam",), window=("1 micro-step",), call_form=("closure, wrapper.backward",))
def test_half_true_keeps_model_and_state_in_its_dtype(make_context: MakeContext, cell: Cell) -> None:
    """bf16-true and 16-true: parameters, forward pass and Adam's state in bfloat16 and float16."""
    dtype = TRUE_DTYPES[cell.precision]
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1, eps=adam_eps(cell)))
    got = {p.dtype for p in model.parameters()}
    assert got == {dtype}, f"{cell.precision} must hold {dtype} parameters, not {sorted(map(str, got))}"
    batch = make_batches(1)[0]
    wrapper.step(lambda: wrapper.backward(context_loss(context, model, batch, cell)), make_optimizer_step=True)
    dtypes = {v.dtype for s in wrapper.optimizer.state.values() for k, v in s.items() if k != "step"}
    assert dtypes == {dtype}, f"{cell.precision} optimizer state is in {sorted(map(str, dtypes))}"


@pytest.mark.requirement("PREC-002")
@pytest.mark.cells(precisions=("16-true",))
@pytest.mark.varies(
    window=("1 micro-step",),
    make_optimizer_step=("True",),
    call_form=("backward, then step()", "closure, wrapper.backward"),
    loss_scale=("initial",),
)
def test_16_true_has_no_autocast_no_loss_scaling_and_never_skips(make_context: MakeContext, cell: Cell) -> None:
    """16-true: the forward in float16 with autocast off, the true (unscaled) gradient, and a non-finite step taken.

    The gradient reaching the loss is 1 and the parameters' gradients are the plain float16 model's; a step whose
    loss is infinite is ``STEPPED`` (no loss scaler skips it) and applies what the plain step applies.
    """
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    batch = make_batches(1)[0]
    device_type = cell_device(cell).type
    with context.autocast():
        enabled = torch.is_autocast_enabled(device_type)
        out = model(batch[0].to(cell_device(cell), torch.float16))
    assert not enabled, f"16-true: autocast is on ({torch.get_autocast_dtype(device_type)}) in context.autocast()"
    assert out.dtype == torch.float16, f"16-true computed the forward pass in {out.dtype}"
    scales: list[float] = []
    wrapper.backward(context_loss(context, model, batch, cell, scales=scales))
    assert scales == [1.0], f"16-true backpropagated the loss by {scales}, not 1: it has no loss scaler (PREC-002)"
    oracle_loss(oracle, batch, cell).backward()
    for (name, got), want in zip(model.named_parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None, f"no gradient for {name}"
        assert got.grad.dtype == torch.float16, f"16-true: the gradient of {name} is {got.grad.dtype}"
        assert torch.equal(got.grad.cpu(), want.grad.cpu()), f"16-true scaled or changed the gradient of {name}"
    wrapper.step(make_optimizer_step=True)
    assert wrapper.last_outcome is StepOutcome.STEPPED, f"a finite 16-true step: {wrapper.last_outcome}"
    torch.optim.SGD(oracle.parameters(), lr=0.1).step()
    for (name, got), want in zip(model.named_parameters(), oracle.parameters(), strict=True):
        assert torch.equal(got.detach().cpu(), want.detach().cpu()), f"16-true's step moved {name} otherwise"
    wrapper.step(
        lambda: wrapper.backward(context_loss(context, model, batch, cell, blow_up=True)), make_optimizer_step=True
    )
    assert wrapper.last_outcome is StepOutcome.STEPPED, (
        f"16-true has no loss scaler and never skips: an infinite loss's step gave {wrapper.last_outcome}"
    )
    assert not all(bool(torch.isfinite(p).all()) for p in model.parameters()), (
        "16-true: the step of an infinite loss left every parameter finite; it applies what it was given"
    )


# -- ERR-007: the dtypes each precision trains --------------------------------------------------------------------


_REFUSED = "ERR-007: a floating-point parameter of a dtype the precision does not train is refused with ValueError"


def _parameter(dtype: torch.dtype, cell: Cell, *, frozen: bool = False) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(3, dtype=dtype, device=cell_device(cell)), requires_grad=not frozen)


def _squares(context: TrainingContext, wrapper: Any, params: list[torch.nn.Parameter]) -> None:
    """A closure: the backward of the sum of ``p * p / 2`` (in float32) over ``params``, whose gradients are ``p``."""
    with context.autocast():
        loss = torch.stack([(p.float() * p.float()).sum() / 2 for p in params]).sum()
    wrapper.backward(loss)


def _groups_unchanged(inner: torch.optim.Optimizer, groups: list[dict[str, Any]], params: list[list[Any]]) -> bool:
    return len(inner.param_groups) == len(groups) and all(
        got is want and list(got["params"]) == kept
        for got, want, kept in zip(inner.param_groups, groups, params, strict=True)
    )


@pytest.mark.requirement("ERR-007", "PREC-001", "PREC-002")
@pytest.mark.varies(
    tensor_dtypes=("float64", "float32", "bfloat16", "float16"),
    parameters=("frozen",),
    param_groups=("1", "added after wrap"),
    faults=("invalid argument",),
)
def test_wrap_takes_exactly_the_dtypes_the_precision_trains(make_context: MakeContext, cell: Cell) -> None:
    """``wrap`` and ``add_param_group`` take the dtypes of ``TRAINED_DTYPES`` and refuse the others, frozen too.

    float64 is taken in 32-true, bf16-mixed and 16-mixed, float16 refused under 16-mixed (its GradScaler cannot
    unscale float16 gradients), and the ``-true`` precisions take only their own dtype. A refused
    ``add_param_group`` leaves the inner optimizer's groups as they were. Each taken parameter steps as plain SGD
    steps it: ``1 - 0.5 * 1`` (its gradient is 1, unscaled exactly under 16-mixed).
    """
    accepted, refused = TRAINED_DTYPES[cell.precision], untrained_dtypes(cell)
    context = make_context()
    for dtype in refused:
        for frozen in (False, True):
            what = f"a {'frozen ' if frozen else ''}{dtype} parameter"
            with refuses(ValueError, f"wrap of an optimizer holding {what} in {cell.precision}", _REFUSED):
                context.wrap(torch.optim.SGD([_parameter(dtype, cell, frozen=frozen)], lr=0.5))
    for dtype in accepted:
        param = _parameter(dtype, cell)
        wrapper = context.wrap(torch.optim.SGD([param], lr=0.5))
        inner = wrapper.optimizer
        for other in refused:
            groups, params = list(inner.param_groups), [list(g["params"]) for g in inner.param_groups]
            for frozen in (False, True):
                what = f"add_param_group of a {'frozen ' if frozen else ''}{other} parameter in {cell.precision}"
                with refuses(ValueError, what, _REFUSED):
                    wrapper.add_param_group({"params": [_parameter(other, cell, frozen=frozen)]})
                assert _groups_unchanged(inner, groups, params), f"{what} was refused, but param_groups changed"
        late = [other for other in accepted if other != dtype][:1]
        added = [_parameter(other, cell) for other in late]
        for extra in added:
            wrapper.add_param_group({"params": [extra], "lr": 0.5})
        if not all(scaler_unscales(cell, p.dtype) for p in [param, *added]):
            continue  # taken, but not trainable here (see scaler_unscales)

        wrapper.step(partial(_squares, context, wrapper, [param, *added]), make_optimizer_step=True)
        assert wrapper.last_outcome is StepOutcome.STEPPED, f"a {dtype} parameter's step: {wrapper.last_outcome}"
        for trained in [param, *added]:
            want = torch.full((3,), 0.5, dtype=trained.dtype)
            assert torch.equal(trained.detach().cpu(), want), (
                f"{cell.precision}: the {trained.dtype} parameter is {trained.tolist()} after its step, not 0.5s"
            )
