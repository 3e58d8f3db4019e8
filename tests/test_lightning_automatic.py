"""Lightning's automatic optimization through the reference strategies, against plain PyTorch loops.

The module is a plain automatic-optimization ``LightningModule``: ``training_step`` returns the loss,
``configure_optimizers`` returns one optimizer and an LR scheduler of ``interval="step"``. The Trainer's
``accumulate_grad_batches``, ``gradient_clip_val`` and precision apply, and a user's ``optimizer_step`` override
receives the reference's wrapper, once per window as Lightning calls it. Every expected value comes from a loop
written here: the windows worked out by hand, plain ``torch.autocast`` and ``torch.amp.GradScaler``,
``clip_grad_norm_`` on the unscaled mean.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, TOLERANCES, make_model
from lightning_optimizer.conformance.oracles import recipe_backward, recipe_window_mean
from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.lightning import (
    ReferenceSingleDeviceStrategy,
    ReferenceXLAAccelerator,
    ReferenceXLAStrategy,
)
from lightning_optimizer.spec import GradScalerSettings, Precision, StepOutcome

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_scenarios.shared import (
    EPOCHS,
    assert_params_close,
    oracle_autocast,
    reference_trainer,
    regression_data,
    regression_loader,
)

Window = Sequence[int]

WINDOWS_OF = {
    1: [[i] for i in range(10)],
    2: [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]],
    3: [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]],
    4: [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]],
}
"""``accumulate_grad_batches`` over an epoch of 10 batches, by hand: full windows, then the epoch's last flushed."""

OVERFLOWING = GradScalerSettings(init_scale=2.0**24, growth_interval=2)
"""A scale at which the first windows overflow in float16 (so steps are skipped, the scale backs off), then grows."""

LR, GAMMA = 0.1, 0.9


class AutomaticRegressor(LightningModule):
    """Automatic optimization, as an existing project writes it; ``override`` adds an ``optimizer_step`` override.

    The override is the proposal's: ``optimizer.step(closure=optimizer_closure)``. It records what it was given
    and each step's outcome.
    """

    def __init__(self, *, override: bool = True, optimizer: str = "sgd") -> None:
        super().__init__()
        self.net = make_model(seed=0)
        self.override = override
        self.optimizer_kind = optimizer
        self.given: list[object] = []
        self.outcomes: list[StepOutcome | None] = []
        self.calls: list[str] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).to(y.dtype), y)
        self.log("train_loss", loss)
        self.calls.append("training_step")
        return loss

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if not self.override:
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
            return
        self.given.append(optimizer)
        optimizer.step(closure=optimizer_closure)
        self.outcomes.append(optimizer.last_outcome)

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("before_zero_grad")

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.calls.append("before_backward")

    def on_after_backward(self) -> None:
        self.calls.append("after_backward")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.calls.append("before_optimizer_step")

    def configure_optimizers(self) -> Any:
        if self.optimizer_kind == "adamw":
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(self.net.parameters(), lr=LR / 10)
        else:
            optimizer = torch.optim.SGD(self.net.parameters(), lr=LR, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=GAMMA)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class GradientProbe(Callback):
    """The gradients a callback sees in ``on_before_optimizer_step``, and the optimizer it is handed."""

    def __init__(self) -> None:
        self.grads: list[list[torch.Tensor]] = []
        self.optimizers: list[object] = []

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self.optimizers.append(optimizer)
        self.grads.append([p.grad.detach().clone() for p in pl_module.parameters() if p.grad is not None])


@dataclass
class Plain:
    """The plain loop's model, what each window's step did, and the gradients it saw before clipping."""

    model: torch.nn.Module
    stepped: list[bool] = field(default_factory=list)
    grads: list[list[torch.Tensor]] = field(default_factory=list)
    lr: float = LR


def plain_loop(
    precision: Precision,
    epoch_windows: Sequence[Sequence[Window]],
    accumulate: Sequence[int],
    *,
    clip: float | None = None,
    clip_algorithm: str = "norm",
    scaler_settings: GradScalerSettings | None = None,
    optimizer_kind: str = "sgd",
) -> Plain:
    """One step per window on the window's mean gradient (unscaled, then clipped), the scheduler after each window.

    ``accumulate`` is each epoch's ``accumulate_grad_batches``: under 16-mixed each loss is the recipe's
    ``scaler.scale(loss / N)`` (AMP-007).
    """
    data = regression_data()
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    model = make_model(seed=0)
    dtype = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
    if dtype is not None:  # what Lightning's 64-true, bf16-true and 16-true do to the module and the inputs
        model.to(dtype)
        batches = [(x.to(dtype), y.to(dtype)) for x, y in batches]
    if optimizer_kind == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=LR / 10)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=GAMMA)
    settings = scaler_settings or GradScalerSettings()
    scaler = GradScaler("cpu", **settings.as_kwargs()) if precision == "16-mixed" else None
    plain = Plain(model)
    applied: list[int] = []
    optimizer.register_step_post_hook(lambda *_: applied.append(1))
    for windows, every in zip(epoch_windows, accumulate, strict=True):
        for window in windows:
            for batch_idx in window:
                x, y = batches[batch_idx]
                with oracle_autocast(precision):
                    loss = torch.nn.functional.mse_loss(model(x).to(y.dtype), y)
                recipe_backward(loss, scaler, every)
            recipe_window_mean(list(model.parameters()), len(window), scaler, every)
            if scaler is not None:
                scaler.unscale_(optimizer)
            plain.grads.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
            if clip is not None and clip_algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            elif clip is not None:
                torch.nn.utils.clip_grad_value_(model.parameters(), clip)
            before = len(applied)
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad(set_to_none=True)
            plain.stepped.append(len(applied) > before)
            scheduler.step()  # Lightning steps it after each window, a step that 16-mixed skipped included
    plain.lr = float(scheduler.get_last_lr()[0])
    return plain


def expected_outcomes(stepped: Sequence[bool]) -> list[StepOutcome]:
    """What ``optimizer_step`` sees after each window's closing step (the batches before it never reach the hook)."""
    return [StepOutcome.STEPPED if taken else StepOutcome.SKIPPED_NON_FINITE for taken in stepped]


def fit(trainer: Trainer, model: LightningModule) -> list[str]:
    """``trainer.fit`` on the regression batches; the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train_dataloaders=regression_loader())
    return [str(w.message) for w in caught]


CASES = {
    "32-true-accumulate-3-clip-norm": ("32-true", 3, 0.05, "norm", None, "sgd"),
    "32-true-accumulate-4-clip-value": ("32-true", 4, 0.01, "value", None, "adamw"),
    "bf16-mixed-accumulate-2": ("bf16-mixed", 2, None, "norm", None, "sgd"),
    "16-mixed-accumulate-3-skips": ("16-mixed", 3, 0.05, "norm", OVERFLOWING, "sgd"),
    "16-mixed-no-accumulation-skips": ("16-mixed", 1, None, "norm", OVERFLOWING, "adamw"),
    "64-true-accumulate-3": ("64-true", 3, None, "norm", None, "sgd"),
    "16-true-accumulate-2-clip-norm": ("16-true", 2, 0.05, "norm", None, "sgd"),
}


@pytest.mark.parametrize(
    ("precision", "accumulate", "clip", "algorithm", "scaler", "optimizer_kind"), CASES.values(), ids=CASES
)
def test_automatic_optimization_matches_a_plain_loop(
    precision: Precision,
    accumulate: int,
    clip: float | None,
    algorithm: str,
    scaler: GradScalerSettings | None,
    optimizer_kind: str,
    tmp_path: Path,
) -> None:
    """Parameters, outcomes, global step, LR schedule and the hook's gradients, window by window.

    As in Lightning, a window whose 16-mixed step was skipped is a global step and a scheduler step all the same;
    the epoch's last, shorter window is the mean of its own batches.
    """
    model = AutomaticRegressor(optimizer=optimizer_kind)
    probe = GradientProbe()
    trainer = reference_trainer(
        tmp_path,
        precision,
        strategy=ReferenceSingleDeviceStrategy(grad_scaler=scaler),
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        gradient_clip_algorithm=algorithm,
        callbacks=[probe],
    )
    caught = fit(trainer, model)
    epoch_windows = [WINDOWS_OF[accumulate]] * EPOCHS
    plain = plain_loop(
        precision,
        epoch_windows,
        [accumulate] * EPOCHS,
        clip=clip,
        clip_algorithm=algorithm,
        scaler_settings=scaler,
        optimizer_kind=optimizer_kind,
    )

    what = f"automatic optimization, {precision}, windows of {accumulate}"
    assert_params_close(model.net, plain.model, TOLERANCES[precision], what)
    assert model.outcomes == expected_outcomes(plain.stepped)
    if scaler is not None:
        assert not all(plain.stepped), "the scale was meant to overflow at first"
    assert trainer.global_step == len(plain.stepped), "Lightning's count: one per window, a skipped step included"
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(plain.lr, rel=1e-12)
    assert all(isinstance(given, WrappedOptimizer) for given in model.given)
    assert len(model.given) == len(plain.stepped), "optimizer_step is called once per window, with the wrapper"
    assert not any(isinstance(optimizer, WrappedOptimizer) for optimizer in probe.optimizers)
    assert len(probe.grads) == len(plain.grads), "on_before_optimizer_step once per real step, skipped ones too"
    tolerance = TOLERANCES[precision]
    for got, want in zip(probe.grads, plain.grads, strict=True):
        for g, w in zip(got, want, strict=True):
            assert torch.allclose(g.double(), w.double(), rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
    assert trainer.accumulate_grad_batches == accumulate
    assert trainer.gradient_clip_val == clip
    order = [message for message in caught if "lr_scheduler.step()" in message]
    assert not order, order


def test_default_optimizer_step_and_the_hooks_of_each_batch(tmp_path: Path) -> None:
    """No override: Lightning's own ``optimizer_step`` drives the wrapper. Lightning's hook order per batch.

    With ``accumulate_grad_batches=3``: ``on_before_zero_grad`` at each window's first batch (as Lightning calls
    it), one backward pair per batch, ``on_before_optimizer_step`` once per real step, after the backward.
    """
    model = AutomaticRegressor(override=False)
    trainer = reference_trainer(tmp_path, "32-true", max_epochs=1, accumulate_grad_batches=3)
    fit(trainer, model)
    plain = plain_loop("32-true", [WINDOWS_OF[3]], [3])
    assert_params_close(model.net, plain.model, TOLERANCES["32-true"], "Lightning's own optimizer_step")

    expected: list[str] = []
    for window in WINDOWS_OF[3]:
        for position, _ in enumerate(window):
            expected.append("training_step")
            if position == 0:
                expected.append("before_zero_grad")
            expected += ["before_backward", "after_backward"]
        expected.append("before_optimizer_step")
    assert model.calls == expected
    assert trainer.global_step == len(WINDOWS_OF[3])


def test_gradient_accumulation_scheduler_changes_the_windows_per_epoch(tmp_path: Path) -> None:
    """``GradientAccumulationScheduler({0: 2, 1: 4})``: windows of 2 in the first epoch, of 4 in the second."""
    model = AutomaticRegressor()
    trainer = reference_trainer(tmp_path, "32-true", callbacks=[GradientAccumulationScheduler({0: 2, 1: 4})])
    fit(trainer, model)
    epoch_windows = [WINDOWS_OF[2], WINDOWS_OF[4]]
    plain = plain_loop("32-true", epoch_windows, [2, 4])
    assert_params_close(model.net, plain.model, TOLERANCES["32-true"], "GradientAccumulationScheduler")
    assert model.outcomes == expected_outcomes(plain.stepped)
    assert trainer.global_step == len(WINDOWS_OF[2]) + len(WINDOWS_OF[4])


class ClippingHook(AutomaticRegressor):
    """Overrides ``configure_gradient_clipping``: records what Lightning hands it, then clips by value itself."""

    def __init__(self) -> None:
        super().__init__()
        self.clipping: list[tuple[object, object, object]] = []

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        self.clipping.append((type(optimizer).__name__, gradient_clip_val, gradient_clip_algorithm))
        self.clip_gradients(optimizer, gradient_clip_val=0.01, gradient_clip_algorithm="value")


def test_configure_gradient_clipping_clips_the_unscaled_mean_once_per_step(tmp_path: Path) -> None:
    """16-mixed: the hook runs once per real step (skipped ones too, as in Lightning), on the torch optimizer, and
    clips the unscaled gradients."""
    model = ClippingHook()
    trainer = reference_trainer(
        tmp_path,
        "16-mixed",
        strategy=ReferenceSingleDeviceStrategy(grad_scaler=OVERFLOWING),
        max_epochs=1,
        accumulate_grad_batches=2,
    )
    fit(trainer, model)
    plain = plain_loop("16-mixed", [WINDOWS_OF[2]], [2], clip=0.01, clip_algorithm="value", scaler_settings=OVERFLOWING)
    assert_params_close(model.net, plain.model, TOLERANCES["16-mixed"], "configure_gradient_clipping")
    assert not all(plain.stepped)
    assert model.clipping == [("SGD", None, None)] * len(plain.stepped)


# -- XLA through the Trainer (torch_xla's CPU backend) ---------------------------------------------------------

needs_xla = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="unavailable here: torch_xla is not installed"
)

XLA_CASES = {
    "32-true": ("32-true", None),
    "64-true": ("64-true", None),
    "bf16-true": ("bf16-true", None),
    "bf16-mixed": ("bf16-mixed", None),
    # torch's scaler factors, a larger first scale: the first window overflows at 2**20 here, its micro-steps
    # backpropagating scaler.scale(loss / 3). (Scalers with other factors in the same process were seen to update
    # with the first one's factors on XLA; the checks elsewhere vary the factors.)
    "16-mixed-skips": ("16-mixed", GradScalerSettings(init_scale=2.0**20)),
}


@pytest.mark.parametrize(("precision", "scaler"), XLA_CASES.values(), ids=XLA_CASES)
@pytest.mark.xla_device
@needs_xla
def test_xla_through_the_trainer_matches_a_plain_loop(
    precision: Precision, scaler: GradScalerSettings | None, tmp_path: Path
) -> None:
    """``Trainer(strategy=ReferenceXLAStrategy(), devices=1)`` on ``xla:0``: the override, windows of 3, clipping.

    Against the plain loop on the CPU, with the tolerance of a backend that fuses (and so rounds) differently.
    """
    model = AutomaticRegressor()
    devices: list[str] = []

    class DeviceProbe(Callback):
        def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, idx: int) -> None:
            devices.append(next(pl_module.parameters()).device.type)

    trainer = Trainer(
        strategy=ReferenceXLAStrategy(grad_scaler=scaler),
        devices=1,
        precision=precision,
        max_epochs=1,
        accumulate_grad_batches=3,
        gradient_clip_val=0.05,
        callbacks=[DeviceProbe()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    assert isinstance(trainer.accelerator, ReferenceXLAAccelerator)
    fit(trainer, model)
    plain = plain_loop(precision, [WINDOWS_OF[3]], [3], clip=0.05, scaler_settings=scaler)

    assert set(devices) == {"xla"}
    if scaler is not None:
        assert not all(plain.stepped), "the first window was meant to overflow"
    assert_params_close(
        model.net, plain.model, REORDERED_TOLERANCES[precision], f"XLA through the Trainer, {precision}"
    )
    assert model.outcomes == expected_outcomes(plain.stepped)
    assert trainer.global_step == len(plain.stepped)
    assert len(model.given) == len(plain.stepped)


@pytest.mark.xla_device
@needs_xla
def test_the_xla_accelerator_takes_one_device_here() -> None:
    """On torch_xla's CPU backend the accelerator finds the runtime's device; several are refused with advice."""
    assert ReferenceXLAAccelerator.is_available()
    assert ReferenceXLAAccelerator.auto_device_count() >= 1
    assert ReferenceXLAAccelerator.get_parallel_devices(1) == [torch.device("xla", 0)]
    assert ReferenceXLAAccelerator.parse_devices("1") == 1
    with pytest.raises(ValueError, match="use devices=1"):
        ReferenceXLAAccelerator.parse_devices(2)
