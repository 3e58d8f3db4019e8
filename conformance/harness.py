"""What the checks share: seeded models and data, the loop that drives an implementation, the tolerance table.

The suite owns every input; an implementation only builds training contexts. Expected values come from the
plain PyTorch oracles in :mod:`lightning_optimizer.conformance.oracles`, never from an implementation.
"""

from __future__ import annotations

import itertools
import re
import types
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.spec import (
    PRECISIONS,
    REQUIREMENTS,
    Cell,
    ContextFactory,
    GradScalerSettings,
    OptimizerWrapper,
    Precision,
    TrainingContext,
)

__all__ = [
    "ON_FAILURE",
    "ZERO_GRAD_AFTER_STEP",
    "FlakyAdam",
    "FlakySGD",
    "LOSS_FACTOR",
    "PlannedFailure",
    "Halves",
    "assert_discard_note",
    "assert_same_state",
    "HALF_ADAM_EPS",
    "adam_eps",
    "REORDERED_TOLERANCES",
    "TOLERANCES",
    "TRUE_DTYPES",
    "UNSCALED_PRECISIONS",
    "FLOATING_DTYPES",
    "TRAINED_DTYPES",
    "untrained_dtypes",
    "Batch",
    "Tolerance",
    "assert_params_close",
    "call_step",
    "cell_device",
    "cell_dtype",
    "context_loss",
    "failure_settings",
    "zeroing_settings",
    "make_batches",
    "make_model",
    "mse",
    "oracle_autocast",
    "oracle_scaler",
    "oracle_step_done",
    "refuses",
    "run_steps",
    "scaler_settings",
    "tolerance_for",
]

Batch = tuple[torch.Tensor, torch.Tensor]

LOSS_FACTOR = 1e-3
"""The checks' factor on their losses: it keeps 16-mixed's scaled float16 gradients finite at GradScaler's initial
scale (and at the other scales the checks set), so that only an injected overflow skips a step."""


@dataclass(frozen=True)
class Tolerance:
    """Relative and absolute tolerance for comparing parameters with an oracle."""

    rtol: float
    atol: float


TOLERANCES: dict[Precision, Tolerance] = {
    # The oracle runs the same operations in the same order: true precisions agree to rounding. In 64-true that is
    # the rounding of an equivalent computation (a mean taken by multiplying, a norm summed in another order).
    "64-true": Tolerance(rtol=1e-12, atol=1e-14),
    "32-true": Tolerance(rtol=1e-6, atol=1e-7),
    "bf16-true": Tolerance(rtol=2e-2, atol=1e-2),
    "16-true": Tolerance(rtol=4e-3, atol=1e-3),
    "bf16-mixed": Tolerance(rtol=1e-2, atol=1e-3),
    "16-mixed": Tolerance(rtol=1e-3, atol=1e-4),
}
"""One table for every check: how close an implementation's parameters must be to the oracle's."""

REORDERED_TOLERANCES: dict[Precision, Tolerance] = {
    "64-true": Tolerance(rtol=1e-12, atol=1e-14),
    "32-true": Tolerance(rtol=1e-5, atol=1e-6),
    "bf16-true": Tolerance(rtol=5e-2, atol=2e-2),
    "16-true": Tolerance(rtol=1e-2, atol=4e-3),
    "bf16-mixed": Tolerance(rtol=2e-2, atol=2e-3),
    "16-mixed": Tolerance(rtol=2e-3, atol=2e-4),
}
"""For oracles that reach the same value by other arithmetic (e.g. one batch instead of a window's mean)."""


def tolerance_for(cell: Cell) -> Tolerance:
    """The cell's tolerance: ``TOLERANCES``, except on XLA, which fuses (and so rounds) differently."""
    return REORDERED_TOLERANCES[cell.precision] if cell.device == "xla" else TOLERANCES[cell.precision]


def cell_device(cell: Cell) -> torch.device:
    """The ``torch.device`` of a cell (XLA needs torch_xla, imported only here)."""
    if cell.device == "xla":
        import torch_xla

        return torch.device(torch_xla.device())
    return torch.device(cell.device)


UNSCALED_PRECISIONS: tuple[Precision, ...] = tuple(p for p in PRECISIONS if p != "16-mixed")
"""Every precision but 16-mixed: no loss scaler, so a closure reaches the inner step and a plain ``loss.backward()``
writes what ``wrapper.backward`` would (torch's ``GradScaler.step`` takes no closure)."""


TRUE_DTYPES: dict[Precision, torch.dtype] = {
    "64-true": torch.float64,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
}
"""The dtype ``prepare_module`` casts a module's floating-point tensors to, per precision that casts [PREC-001,
PREC-002]. 32-true and the mixed precisions cast nothing: the suite's float32 models stay float32 there."""


FLOATING_DTYPES: tuple[torch.dtype, ...] = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
TRAINED_DTYPES: dict[Precision, tuple[torch.dtype, ...]] = {
    "64-true": (torch.float64,),
    "32-true": FLOATING_DTYPES,
    "bf16-mixed": FLOATING_DTYPES,
    "16-mixed": (torch.float64, torch.float32, torch.bfloat16),
    "bf16-true": (torch.bfloat16,),
    "16-true": (torch.float16,),
}
"""By hand from ERR-007: the floating-point parameter dtypes each precision trains (``wrap`` refuses the others).

The ``-true`` precisions other than 32-true train their own dtype only; 16-mixed anything but float16 (its GradScaler
cannot unscale float16 gradients); 32-true and bf16-mixed anything."""


def untrained_dtypes(cell: Cell) -> tuple[torch.dtype, ...]:
    """The floating-point dtypes a context of the cell's precision refuses a parameter of [ERR-007]."""
    return tuple(dtype for dtype in FLOATING_DTYPES if dtype not in TRAINED_DTYPES[cell.precision])


def cell_dtype(cell: Cell) -> torch.dtype:
    """The dtype the suite's (float32) models have once prepared in a cell's precision: its parameters' dtype."""
    return TRUE_DTYPES.get(cell.precision, torch.float32)


HALF_ADAM_EPS = 1e-4
"""Adam's ``eps`` in a 16-true cell: torch's default (1e-8) is zero in float16, whose smallest subnormal is 6e-8."""


def adam_eps(cell: Cell) -> float:
    """The ``eps`` the checks give Adam (and AdamW) in a cell, on both sides: torch's default but in 16-true.

    In 16-true the optimizer state is float16 [PREC-002]: a second moment of the checks' small gradients underflows
    to zero there, and with torch's default ``eps``, zero in float16 too, a step divides by zero (inf or NaN on both
    sides alike, which no check can compare). ``HALF_ADAM_EPS`` is what a float16 user sets.
    """
    return HALF_ADAM_EPS if cell.precision == "16-true" else 1e-8


def oracle_autocast(cell: Cell) -> AbstractContextManager[None]:
    """The plain ``torch.autocast`` an oracle runs its forward pass under, per the cell's precision.

    With the weight cache off, as Lightning opens it: a forward after a step sees the new parameters [PREC-004].
    """
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(cell.precision)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=cell_device(cell).type, dtype=dtype, cache_enabled=False)


def oracle_step_done(cell: Cell) -> None:
    """What a plain XLA loop does after each optimizer step: cut the lazy graph (nothing elsewhere)."""
    if cell.device == "xla":
        import torch_xla

        torch_xla.sync()


def oracle_scaler(cell: Cell) -> GradScaler | None:
    """A fresh plain ``torch.amp.GradScaler`` for a 16-mixed oracle (default settings), ``None`` otherwise."""
    return GradScaler(cell_device(cell).type) if cell.precision == "16-mixed" else None


ContextT = TypeVar("ContextT", bound=TrainingContext)

ON_FAILURE: tuple[Any, ...] = (
    pytest.param("discard", id="discard"),
    pytest.param("restore", id="restore", marks=pytest.mark.features("exact_restore")),
)
"""``pytest.mark.parametrize("on_failure", ON_FAILURE)``: a check of a failed call under each failure policy.

The default (``"discard"``, FAIL-001) everywhere; ``"restore"`` only where the implementation claims the feature
``"exact_restore"`` (``n/a`` otherwise). Build the context with ``make_context(**failure_settings(on_failure))``.
"""


ZERO_GRAD_AFTER_STEP: tuple[Any, ...] = (
    pytest.param(True, id="zero-after-step"),
    pytest.param(False, id="user-zero-grad", marks=pytest.mark.features("user_zero_grad")),
)
"""``pytest.mark.parametrize("zero_grad_after_step", ZERO_GRAD_AFTER_STEP)``: a check under each zeroing setting.

The default (``True``: every real step clears its gradients, ZERO-001) everywhere; ``False`` (the user's
``zero_grad()`` clears them, ZERO-003 to ZERO-007) only where the implementation claims the feature
``"user_zero_grad"`` (``n/a`` otherwise). Build the context with ``make_context(**zeroing_settings(...))``.
"""


def scaler_settings(cell: Cell, settings: GradScalerSettings) -> dict[str, Any]:
    """The factory's ``grad_scaler`` argument: ``settings`` in 16-mixed cells, nothing in the others."""
    return {"grad_scaler": settings} if cell.precision == "16-mixed" else {}


def failure_settings(on_failure: str) -> dict[str, Any]:
    """The factory's ``on_failure`` argument: none for the default ``"discard"`` (left to the factory), else it."""
    return {} if on_failure == "discard" else {"on_failure": on_failure}


def zeroing_settings(zero_grad_after_step: bool) -> dict[str, Any]:
    """The factory's ``zero_grad_after_step`` argument: none for the default ``True`` (left to the factory), else it.

    The suite passes ``False`` only to an implementation that claims ``"user_zero_grad"`` (ZERO-003).
    """
    return {} if zero_grad_after_step else {"zero_grad_after_step": False}


def assert_discard_note(
    error: BaseException,
    optimizer: torch.optim.Optimizer | type[torch.optim.Optimizer],
    micro_steps: Sequence[int],
    what: str,
) -> None:
    """The note a discarded window's exception carries [FAIL-003]: the optimizer, the count, the way to keep them.

    The optimizer is named by its class (or a torch class it derives from); the count of micro-steps discarded is
    one of ``micro_steps`` (the rule leaves open whether the failed call's own micro-step counts); the note names
    ``on_failure="restore"``.
    """
    notes = [note for note in getattr(error, "__notes__", ()) if isinstance(note, str)]
    text = "\n".join(notes)
    assert notes, (
        f"{what}: the exception ({type(error).__name__}: {error}) carries no note; a discarded window's exception "
        'gets one (BaseException.add_note) naming the optimizer, the micro-steps discarded and on_failure="restore" '
        "[FAIL-003]"
    )
    names = [
        kind.__name__
        for kind in (optimizer if isinstance(optimizer, type) else type(optimizer)).__mro__
        if issubclass(kind, torch.optim.Optimizer) and kind is not torch.optim.Optimizer
    ]
    assert any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) for name in names), (
        f"{what}: the exception's note {text!r} names no class of the optimizer ({', '.join(names)}) [FAIL-003]"
    )
    assert re.search(r"""on_failure\s*=\s*["']restore["']""", text), (
        f'{what}: the exception\'s note {text!r} does not name on_failure="restore" as the way to keep the '
        "micro-steps [FAIL-003]"
    )
    counts = sorted(set(micro_steps))
    assert any(re.search(rf"(?<![0-9.]){count}(?![0-9.])", text) for count in counts), (
        f"{what}: the exception's note {text!r} does not say how many micro-steps were discarded "
        f"({' or '.join(map(str, counts))}) [FAIL-003]"
    )


def build_context(factory: ContextFactory[ContextT], cell: Cell, **settings: Any) -> ContextT:
    """``factory(cell, **settings)``, in a 16-mixed cell always with ``grad_scaler`` (torch's defaults unless given).

    So no check relies on an implementation's own scaler configuration, only on the one its oracle uses.
    """
    if cell.precision == "16-mixed" and settings.get("grad_scaler") is None:
        settings["grad_scaler"] = GradScalerSettings()
    return factory(cell, **settings)


def make_model(seed: int = 0, sizes: Sequence[int] = (4, 8, 2)) -> torch.nn.Sequential:
    """A small seeded MLP on the CPU, in float32."""
    generator = torch.Generator().manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        linear = torch.nn.Linear(fan_in, fan_out)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(fan_out, fan_in, generator=generator) / fan_in**0.5)
            linear.bias.copy_(torch.randn(fan_out, generator=generator) * 0.1)
        layers.append(linear)
        if i < len(sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


class Halves(torch.nn.Module):
    """Two independent models ``a`` and ``b``, one optimizer each: a loss of one half gives gradients to it only."""

    def __init__(self, seed_a: int, seed_b: int) -> None:
        super().__init__()
        self.a = make_model(seed=seed_a)
        self.b = make_model(seed=seed_b)


def assert_same_state(got: object, want: object, what: str, path: str = "state") -> None:
    """Two state dicts hold the same structure and values (tensors bit for bit, same dtype)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{what}: {path} is {type(got).__name__}, was a tensor"
        assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {path} is {got.shape} {got.dtype}"
        assert torch.equal(got.cpu(), want.cpu()), f"{what}: {path} changed"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{what}: {path} has keys {got}, had {sorted(want)}"
        for key, value in want.items():
            assert_same_state(got[key], value, what, f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert isinstance(got, list | tuple) and len(got) == len(want), f"{what}: {path} is {got}, was {want}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_same_state(a, b, what, f"{path}[{i}]")
    else:
        assert got == want, f"{what}: {path} is {got!r}, was {want!r}"


def make_batches(count: int, seed: int = 1, batch_size: int = 4, features: int = 4, targets: int = 2) -> list[Batch]:
    """``count`` seeded ``(x, y)`` batches on the CPU, in float32."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, features, generator=generator), torch.randn(batch_size, targets, generator=generator))
        for _ in range(count)
    ]


def mse(model: torch.nn.Module, batch: Batch, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Mean squared error of ``model`` on ``batch``, with the batch moved to the model's device and dtype."""
    x, y = (t.to(device=device, dtype=dtype) for t in batch)
    return torch.nn.functional.mse_loss(model(x).to(dtype), y)


def context_loss(
    context: TrainingContext,
    model: torch.nn.Module,
    batch: Batch,
    cell: Cell,
    blow_up: bool = False,
    factor: float = LOSS_FACTOR,
    *,
    scales: list[float] | None = None,
) -> torch.Tensor:
    """``factor`` times the model's MSE on ``batch`` under ``context.autocast()``; infinite with ``blow_up``.

    The implementation's side of the oracle's ``plain_loop.oracle_loss``. ``scales`` receives the factor that its
    backward pass propagates (the gradient reaching the loss): its loss scale.
    """
    with context.autocast():
        loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * factor
    loss = loss * float("inf") if blow_up else loss
    if scales is not None:
        loss.register_hook(lambda grad: scales.append(float(grad)))
    return loss


def call_step(
    wrapper: OptimizerWrapper[Any],
    form: Literal["closure", "backward"],
    loss_of: Callable[[], torch.Tensor],
    make_optimizer_step: bool | None = None,
    *,
    then: Callable[[], object] | None = None,
) -> None:
    """One ``step()`` call in ``form``: ``"closure"`` or ``"backward"`` (the wrapper's backward, then ``step()``).

    The micro-step is ``wrapper.backward(loss_of())`` followed by ``then()`` (``unscale_gradients()``, say): in the
    closure form inside the closure, in the other before the closure-less ``step()``.
    """

    def micro_step() -> None:
        wrapper.backward(loss_of())
        if then is not None:
            then()

    if form == "closure":
        wrapper.step(micro_step, make_optimizer_step=make_optimizer_step)
    else:
        micro_step()
        wrapper.step(make_optimizer_step=make_optimizer_step)


def run_steps(
    context: TrainingContext,
    model: torch.nn.Module,
    wrapper: OptimizerWrapper[Any],
    batches: Sequence[Batch],
    cell: Cell,
    make_optimizer_step: Callable[[int], bool | None] = lambda batch_idx: None,
    *,
    plain_backward: bool = False,
) -> list[Any]:
    """Drive one epoch in the closure form: each batch a ``context.batch`` block and one ``step(closure)``.

    Returns each call's ``last_outcome``.
    """
    outcomes = []
    device, dtype = cell_device(cell), cell_dtype(cell)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

            def closure(batch: Batch = batch) -> torch.Tensor:
                with context.autocast():
                    loss = mse(model, batch, device, dtype)
                if plain_backward:
                    loss.backward()
                else:
                    wrapper.backward(loss)
                return loss

            wrapper.step(closure, make_optimizer_step=make_optimizer_step(batch_idx))
            outcomes.append(wrapper.last_outcome)
    return outcomes


def assert_params_close(
    actual: torch.nn.Module, expected: torch.nn.Module, cell: Cell, what: str, tolerance: Tolerance | None = None
) -> None:
    """Compare every parameter with the oracle's, in the cell's tolerance; name the first one that differs.

    An oracle whose parameter is not finite overflowed the cell's dtype itself (float16's range is small): that is
    the check's defect, said as such, never a comparison (NaN is close to nothing).
    """
    tol = tolerance or tolerance_for(cell)
    for (name, got), (_, want) in zip(actual.named_parameters(), expected.named_parameters(), strict=True):
        got_cpu, want_cpu = got.detach().cpu().double(), want.detach().cpu().double()
        if not bool(torch.isfinite(want_cpu).all()):
            raise AssertionError(
                f"{what}: the plain-PyTorch oracle's parameter {name!r} is not finite on {cell.id}: the check's own "
                f"inputs overflow {cell.precision} (a defect of the check, not of the implementation)"
            )
        if not torch.allclose(got_cpu, want_cpu, rtol=tol.rtol, atol=tol.atol):
            diff = (got_cpu - want_cpu).abs().max().item()
            raise AssertionError(
                f"{what}: parameter {name!r} differs from the plain-PyTorch oracle on {cell.id} "
                f"(max abs diff {diff:.3g}, rtol {tol.rtol}, atol {tol.atol})"
            )


E = TypeVar("E", bound=BaseException)

_WHY = re.compile(r"(?P<ids>[A-Z]+-\d{3}(?:, [A-Z]+-\d{3})*): \S")


class _Refusal(Generic[E]):
    """The context manager of :func:`refuses`: ``pytest.raises``, with the call and the rule named on a failure."""

    def __init__(
        self,
        expected: type[E] | tuple[type[E], ...],
        call: str,
        why: str,
        match: str | re.Pattern[str] | None,
    ) -> None:
        opening = _WHY.match(why)
        unknown = [] if opening is None else [i for i in opening["ids"].split(", ") if i not in REQUIREMENTS]
        if opening is None or unknown:
            raise ValueError(f"refuses(why={why!r}) must open with known requirement ids and a colon: {unknown}")
        names = [kind.__name__ for kind in (expected if isinstance(expected, tuple) else (expected,))]
        self._expected = " or ".join(names)
        self._call, self._why = call, why
        self._raises = pytest.raises(expected, match=match)

    def __enter__(self) -> pytest.ExceptionInfo[E]:
        return self._raises.__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: types.TracebackType | None,
    ) -> bool:
        __tracebackhide__ = True
        if exc_type is None:
            pytest.fail(f"{self._call} did not raise {self._expected} ({self._why})")
        try:
            return self._raises.__exit__(exc_type, exc_val, exc_tb)
        except AssertionError as mismatch:  # the right type, but its message does not match ``match``
            raise AssertionError(
                f"{self._call} raised {exc_type.__name__}, but not with the message expected ({self._why}): {mismatch}"
            ) from None


def refuses(
    expected: type[E] | tuple[type[E], ...],
    call: str,
    why: str,
    *,
    match: str | re.Pattern[str] | None = None,
) -> _Refusal[E]:
    """``pytest.raises(expected, match=match)`` whose failure says which call should have raised, and why.

    ``call`` describes what the block calls, in the check's own terms (``"wrapper b's step() called from inside
    wrapper a's running step()"``); ``why`` opens with the requirement ids and a colon, then says what the contract
    expects (``"REENT-001: a step() re-entered while a step() of the same context runs is refused"``).

    When the block raises nothing, the check fails with ``<call> did not raise <expected> (<why>)`` instead of a
    bare ``DID NOT RAISE``. When it raises ``expected`` with a message that ``match`` does not find
    (``re.search``), the failure names the call too. Everything else is ``pytest.raises``'s: an exception of another
    type propagates unchanged, and the ``ExceptionInfo`` given to ``as`` holds the exception caught.
    """
    return _Refusal(expected, call, why, match)


class PlannedFailure(RuntimeError):
    """What a check's closures, hooks and inner steps raise on purpose: the check expects this very exception."""


class _Flaky(torch.optim.Optimizer):
    """An optimizer whose ``step`` raises, before it changes anything, while ``fail`` is set."""

    fail = False

    def step(self, closure: Any = None) -> Any:
        """Raise :class:`PlannedFailure` while ``fail`` is set; the optimizer's own step otherwise."""
        if self.fail:
            raise PlannedFailure("the inner optimizer's step fails (planted by the check)")
        return super().step(closure)


class FlakySGD(_Flaky, torch.optim.SGD):
    """An SGD whose ``step`` raises, before it changes anything, while ``fail`` is set."""


class FlakyAdam(_Flaky, torch.optim.Adam):
    """An Adam whose ``step`` raises, before it changes anything, while ``fail`` is set."""
