"""The reference in a real ``lightning.pytorch.Trainer.fit``, through its Lightning strategies.

``LIGHTNING_NAMESPACE=pytorch_lightning`` runs them in ``pytorch_lightning.Trainer.fit`` on the twin package.

Every expected value comes from a plain PyTorch loop written here (plain ``torch.autocast``, a plain
``torch.amp.GradScaler`` under 16-mixed, windows worked out by hand), compared with the suite's tolerance
table. DDP and the resume run in fresh processes (tests/lightning_scenarios), started as real subprocesses.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loops.optimization.automatic import _AutomaticOptimization
from lightning.pytorch.strategies import StrategyRegistry
from torch.amp.grad_scaler import GradScaler
from torch.utils.data import DistributedSampler, TensorDataset

from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, TOLERANCES, Tolerance, make_model
from lightning_optimizer.conformance.oracles import recipe_backward, recipe_window_mean
from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.lightning import (
    STRATEGY_NAMES,
    ReferenceDDPStrategy,
    ReferenceFSDPStrategy,
    ReferencePrecision,
    ReferenceSingleDeviceStrategy,
    ReferenceXLAStrategy,
    wrapped_optimizers,
)
from lightning_optimizer.reference.lightning import compat as lightning_compat
from lightning_optimizer.spec import GradScalerSettings, Precision, StepOutcome

TESTS = Path(__file__).resolve().parent
# A hang guard on each subprocess here, never a speed check: the longest, the two-rank scenarios of
# tests/test_lightning_distributed.py in one launch, took 43 s on 2 cores beside other jobs (load 3.5); the DDP and FSDP
# scenarios up to 33 s. 900 s is 20 times the longest.
TIMEOUT_S = 900
sys.path.insert(0, str(TESTS))  # the scenarios package, shared with the subprocesses (which get it on PYTHONPATH)

from lightning_scenarios.shared import (  # noqa: E402
    BATCHES_PER_EPOCH,
    EPOCHS,
    GAN_BATCH,
    RESUME_SAVE_AT,
    AutomaticWindowedRegressor,
    BackwardThenStep,
    Batch,
    ResumableBatches,
    WindowedRegressor,
    assert_params_close,
    gan_batches,
    gan_class,
    gan_data,
    oracle_autocast,
    reference_trainer,
    regression_data,
    regression_loader,
    run_gan,
)

MIXED = ("32-true", "bf16-mixed", "16-mixed")
AUTOCAST_DTYPE = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
WINDOWS = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
"""accumulate_grad_batches=3 over 10 batches, by hand: three full windows, then the last batch's window of 1."""


# -- plain PyTorch oracles -------------------------------------------------------------------------------------


@dataclass
class Oracle:
    """A plain loop's outcome: its model, how many optimizer steps it applied, and what it saw on the way."""

    model: torch.nn.Module
    applied_steps: int = 0
    closing_steps: int = 0
    """Steps the loop took, those the loss scaler skipped included: Lightning's count of ``step()`` calls."""
    scaler: GradScaler | None = None
    losses: list[float] = field(default_factory=list)
    other_losses: list[float] = field(default_factory=list)
    stepped: list[bool] = field(default_factory=list)
    """For each window, in order: whether the step was applied (``False``: the scaler skipped it)."""
    step_grads: list[list[torch.Tensor]] = field(default_factory=list)
    """For each window, the gradients its step applies: mean, unscaled, clipped."""

    def count(self, *optimizers: torch.optim.Optimizer) -> None:
        def applied(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.applied_steps += 1

        for optimizer in optimizers:
            optimizer.register_step_post_hook(applied)


def oracle_scaler(precision: Precision) -> GradScaler | None:
    return GradScaler("cpu") if precision == "16-mixed" else None


def frozen(module: torch.nn.Module) -> AbstractContextManager[None]:
    """What the reference's toggling does to the other optimizer's parameters inside a closure."""

    class Frozen:
        def __enter__(self) -> None:
            module.requires_grad_(False)

        def __exit__(self, *exc: object) -> None:
            module.requires_grad_(True)

    return Frozen()


def gan_oracle(precision: Precision, batches: Sequence[Batch], epochs: int = EPOCHS) -> Oracle:
    """The proposal's GAN by hand: the generator's windows close on even batches, the discriminator steps every 4.

    ``make_optimizer_step`` is explicit, so a window open at an epoch's end (batch 9) closes at the next epoch's
    batch 0. Under 16-mixed one scaler serves both optimizers and is updated once, after the batch's steps.
    """
    model = gan_class()()
    gen, dis = model.get_submodule("generator"), model.get_submodule("discriminator")
    opt_gen = torch.optim.Adam(gen.parameters(), lr=0.01)
    opt_dis = torch.optim.SGD(dis.parameters(), lr=0.05)
    oracle = Oracle(model, scaler=oracle_scaler(precision))
    oracle.count(opt_gen, opt_dis)
    scaler = oracle.scaler

    def backward(loss: torch.Tensor) -> None:
        (loss if scaler is None else scaler.scale(loss)).backward()

    def step(optimizer: torch.optim.Optimizer) -> None:
        oracle.closing_steps += 1
        if scaler is None:
            optimizer.step()
        else:
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    window = 0
    for _ in range(epochs):
        for batch_idx, (noise, real) in enumerate(batches):
            with frozen(dis):
                with oracle_autocast(precision):
                    loss_gen = -dis(gen(noise)).mean()
                backward(loss_gen)
            oracle.losses.append(float(loss_gen.detach()))
            window += 1
            if batch_idx % 2 == 0:
                with torch.no_grad():
                    for param in gen.parameters():
                        assert param.grad is not None
                        param.grad /= window
                step(opt_gen)
                window = 0
            if batch_idx % 4 == 0:
                with frozen(gen):
                    with oracle_autocast(precision):
                        loss_dis = dis(gen(noise).detach()).mean() - dis(real).mean()
                    backward(loss_dis)
                oracle.other_losses.append(float(loss_dis.detach()))
                step(opt_dis)
            if scaler is not None and batch_idx % 2 == 0:
                scaler.update()
    return oracle


def windows_oracle(
    precision: Precision,
    batches: Sequence[Batch],
    windows: Sequence[Sequence[int]],
    accumulate: int,
    *,
    epochs: int = EPOCHS,
    clip: float | None = None,
    scaler_settings: GradScalerSettings | None = None,
) -> Oracle:
    """``WindowedRegressor`` by hand: one step per window on the window's mean gradient, then the scheduler.

    Under 16-mixed each loss is the recipe's ``scaler.scale(loss / accumulate)`` (AMP-007).
    """
    model = WindowedRegressor().net
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    settings = (scaler_settings or GradScalerSettings()).as_kwargs()
    oracle = Oracle(model, scaler=GradScaler("cpu", **settings) if precision == "16-mixed" else None)
    oracle.count(optimizer)
    scaler = oracle.scaler
    for _ in range(epochs):
        for window in windows:
            for batch_idx in window:
                x, y = batches[batch_idx]
                with oracle_autocast(precision):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                recipe_backward(loss, scaler, accumulate)
            recipe_window_mean(list(model.parameters()), len(window), scaler, accumulate)
            if scaler is not None:
                scaler.unscale_(optimizer)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            oracle.step_grads.append(
                [param.grad.detach().clone() for param in model.parameters() if param.grad is not None]
            )
            before = oracle.applied_steps
            oracle.closing_steps += 1
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad(set_to_none=True)
            oracle.stepped.append(oracle.applied_steps > before)
            if oracle.stepped[-1]:
                scheduler.step()
    return oracle


def backward_then_step_oracle(
    precision: Precision, batches: Sequence[Batch], windows: Sequence[Sequence[int]], accumulate: int, epochs: int = 1
) -> Oracle:
    """``BackwardThenStep`` by hand: both heads step on each window's mean; the second head's loss counts twice.

    Under 16-mixed each backward is the recipe's ``scaler.scale(loss / accumulate)`` (AMP-007).
    """
    model = BackwardThenStep()
    opt_a = torch.optim.SGD(model.head_a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.Adam(model.head_b.parameters(), lr=0.01)
    oracle = Oracle(model, scaler=oracle_scaler(precision))
    oracle.count(opt_a, opt_b)
    scaler = oracle.scaler
    for _ in range(epochs):
        for window in windows:
            for batch_idx in window:
                x, y = batches[batch_idx]
                for head, times in ((model.head_a, 1), (model.head_b, 2)):
                    with oracle_autocast(precision):
                        loss = torch.nn.functional.mse_loss(head(x).float(), y)
                    for _ in range(times):
                        scaled = loss if scaler is None else scaler.scale(loss / accumulate)
                        scaled.backward(retain_graph=True)
            for optimizer in (opt_a, opt_b):
                own = [param for group in optimizer.param_groups for param in group["params"]]
                assert all(param.grad is not None for param in own)
                recipe_window_mean(own, len(window), scaler, accumulate)
                oracle.closing_steps += 1
                if scaler is None:
                    optimizer.step()
                else:
                    scaler.unscale_(optimizer)
                    scaler.step(optimizer)
                optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.update()
    return oracle


def expected_outcomes(windows: Sequence[Sequence[int]], stepped: Sequence[bool]) -> list[StepOutcome]:
    closing = iter(stepped)
    outcomes: list[StepOutcome] = []
    for _ in range(len(stepped) // len(windows)):
        for window in windows:
            outcomes += [StepOutcome.ACCUMULATED] * (len(window) - 1)
            outcomes.append(StepOutcome.STEPPED if next(closing) else StepOutcome.SKIPPED_NON_FINITE)
    return outcomes


# -- observing a run -------------------------------------------------------------------------------------------


class ContextProbe(Callback):
    """What the strategy's training context looks like at the end of training (before teardown)."""

    def __init__(self) -> None:
        self.scale: float | None = None
        self.plugin: object = None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.plugin = trainer.precision_plugin
        strategy = trainer.strategy
        assert isinstance(strategy, ReferenceSingleDeviceStrategy | ReferenceXLAStrategy)
        context = strategy.reference_context
        assert context is not None
        self.scale = None if context.scaler is None else context.scaler.get_scale()


class ProgressProbe(Callback):
    """The progress bar's position and total at the end of each epoch."""

    def __init__(self) -> None:
        self.bars: list[tuple[float, float | None]] = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        bar = trainer.progress_bar_callback
        assert isinstance(bar, TQDMProgressBar)
        self.bars.append((bar.train_progress_bar.n, bar.train_progress_bar.total))


def run_scenario(name: str, *args: object, timeout: float = TIMEOUT_S) -> None:
    """``python -m lightning_scenarios.<name> ARGS`` in its own session; a run past ``timeout`` is killed whole."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    command = [sys.executable, "-m", f"lightning_scenarios.{name}", *map(str, args)]
    process = subprocess.Popen(
        command,
        cwd=TESTS.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the scenario and any rank it started
        output, _ = process.communicate()
        pytest.fail(f"scenario {name} ran past {timeout} s:\n{output[-4000:]}")
    assert process.returncode == 0, f"scenario {name} exited {process.returncode}:\n{output[-4000:]}"


# -- the proposal's GAN in a Trainer ---------------------------------------------------------------------------


@pytest.mark.parametrize("precision", MIXED)
def test_gan_matches_a_plain_loop(precision: Precision, tmp_path: Path) -> None:
    """Two epochs of 10 batches; 16-mixed on the CPU stays fp16 with a loss scaler (no switch to bf16)."""
    batches = gan_batches()
    model = gan_class()()
    dtypes: list[torch.dtype] = []
    model.get_submodule("generator").register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    probe = ContextProbe()
    trainer = reference_trainer(tmp_path, precision, callbacks=[probe])
    trainer.fit(model, train_dataloaders=ResumableBatches(batches))

    oracle = gan_oracle(precision, batches)
    assert trainer.precision == precision
    assert isinstance(probe.plugin, ReferencePrecision)
    assert set(dtypes) == {AUTOCAST_DTYPE[precision]}, f"forward passes ran in {set(dtypes)}"
    assert_params_close(model, oracle.model, TOLERANCES[precision], f"GAN in a Trainer, {precision}")
    assert trainer.global_step == oracle.closing_steps
    if precision == "16-mixed":
        assert oracle.scaler is not None
        assert probe.scale == oracle.scaler.get_scale()
    else:
        assert probe.scale is None
        assert trainer.global_step == 2 * (5 + 3)  # generator at 0, 2, 4, 6, 8; discriminator at 0, 4, 8


@pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="unavailable here: torch_xla is not installed"
)
@pytest.mark.parametrize("precision", ["16-mixed"])
def test_gan_on_xla_through_the_trainer(precision: Precision, tmp_path: Path) -> None:
    """The proposal's GAN on ``xla:0`` (torch_xla's CPU backend): ``ReferenceXLAStrategy``, one device."""
    batches = gan_batches()
    model = gan_class()()
    probe = ContextProbe()
    trainer = xla_trainer(tmp_path, precision, max_epochs=EPOCHS, callbacks=[probe])
    trainer.fit(model, train_dataloaders=ResumableBatches(batches))
    oracle = gan_oracle(precision, batches)
    assert trainer.precision == precision
    assert isinstance(probe.plugin, ReferencePrecision)
    assert_params_close(model, oracle.model, REORDERED_TOLERANCES[precision], f"GAN on XLA, {precision}")
    assert trainer.global_step == oracle.closing_steps
    if oracle.scaler is not None:
        assert probe.scale == oracle.scaler.get_scale()


WINDOWS_OF_2 = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
XLA_AGAINST_CPU = Tolerance(rtol=REORDERED_TOLERANCES["16-mixed"].rtol, atol=6e-4)
"""16-mixed on XLA's CPU backend against a plain loop on the CPU (measured: plain loop against plain loop, 2.9e-4)."""


@pytest.mark.parametrize(
    ("precision", "device"),
    [("32-true", "cpu"), ("16-mixed", "cpu"), pytest.param("16-mixed", "xla", marks=pytest.mark.xla_device)],
    ids=["cpu-32-true", "cpu-16-mixed", "xla-16-mixed"],
)
def test_backward_then_step_matches_a_plain_loop(precision: Precision, device: str, tmp_path: Path) -> None:
    """The proposal's first example (two optimizers, each ``backward`` then ``step``, one loss backpropagated twice)
    with ``accumulate_grad_batches=2``: both heads step on each window's mean, one scaler updated per batch."""
    if device == "xla" and importlib.util.find_spec("torch_xla") is None:
        pytest.skip("unavailable here: torch_xla is not installed")
    model = BackwardThenStep()
    if device == "xla":
        trainer = xla_trainer(tmp_path, precision, max_epochs=1, accumulate_grad_batches=2)
    else:
        trainer = reference_trainer(tmp_path, precision, max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(model, train_dataloaders=regression_loader())
    data = regression_data()
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    oracle = backward_then_step_oracle(precision, batches, WINDOWS_OF_2, 2)
    # The oracle runs on the CPU. The same plain loop run on XLA's CPU backend ends up to 2.9e-4 from it here (float16
    # rounded otherwise, then two Adam and momentum steps): the XLA case allows three times the 16-mixed table's atol.
    tolerance = XLA_AGAINST_CPU if device == "xla" else TOLERANCES[precision]
    assert_params_close(model, oracle.model, tolerance, f"backward then step, {device}, {precision}")
    assert trainer.global_step == oracle.closing_steps


def xla_trainer(root: Path, precision: str, **kwargs: Any) -> Trainer:
    """A quiet Trainer on ``ReferenceXLAStrategy`` (one device), writing only under ``root``."""
    return Trainer(
        strategy=ReferenceXLAStrategy(),
        devices=1,
        precision=precision,  # type: ignore[arg-type]  # one of the reference's names
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kwargs,
    )


@pytest.mark.xla_device
@pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="unavailable here: torch_xla is not installed"
)
def test_manual_backward_on_xla_through_the_trainer(tmp_path: Path) -> None:
    """``self.manual_backward`` in the closure, 16-mixed, windows of 3 on ``xla:0``: the reference scales it."""
    model = WindowedRegressor(manual_backward=True)
    trainer = xla_trainer(tmp_path, "16-mixed", max_epochs=1, accumulate_grad_batches=3)
    trainer.fit(model, train_dataloaders=regression_loader())
    data = regression_data()
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    oracle = windows_oracle("16-mixed", batches, WINDOWS, 3, epochs=1)
    assert_params_close(model.net, oracle.model, REORDERED_TOLERANCES["16-mixed"], "manual_backward on XLA")
    assert model.outcomes == expected_outcomes(WINDOWS, oracle.stepped)


def test_logging_progress_bar_and_global_step(tmp_path: Path) -> None:
    """``self.log`` inside the closures, the progress bar, and one global step per step that closes a window."""
    batches = gan_batches()
    model = gan_class()()
    progress = ProgressProbe()
    logger = CSVLogger(tmp_path, name="gan")
    trainer = reference_trainer(
        tmp_path, "32-true", logger=logger, enable_progress_bar=True, log_every_n_steps=1, callbacks=[progress]
    )
    trainer.fit(model, train_dataloaders=ResumableBatches(batches))
    oracle = gan_oracle("32-true", batches)

    assert progress.bars == [(BATCHES_PER_EPOCH, BATCHES_PER_EPOCH)] * EPOCHS
    assert {"loss_gen_step", "loss_gen_epoch"} <= set(trainer.progress_bar_metrics)
    # 5 generator and 3 discriminator steps an epoch; the logger's step axis counts batches, as in manual mode.
    assert trainer.global_step == oracle.closing_steps == 16
    rows = (Path(logger.log_dir) / "metrics.csv").read_text(encoding="utf-8").splitlines()
    header, records = (
        rows[0].split(","),
        [dict(zip(rows[0].split(","), row.split(","), strict=True)) for row in rows[1:]],
    )
    assert {"step", "epoch", "loss_gen_step", "loss_dis_step", "loss_gen_epoch", "loss_dis_epoch"} <= set(header)
    gen_steps = [(int(r["step"]), float(r["loss_gen_step"])) for r in records if r["loss_gen_step"]]
    assert [step for step, _ in gen_steps] == list(range(EPOCHS * BATCHES_PER_EPOCH))
    assert [loss for _, loss in gen_steps] == pytest.approx(oracle.losses, rel=1e-5, abs=1e-6)
    # The discriminator logs at batches 0, 4 and 8; Lightning repeats a step value until it is logged again.
    dis_rows = [(int(r["step"]), float(r["loss_dis_step"])) for r in records if r["loss_dis_step"]]
    assert [step for step, _ in dis_rows] == list(range(EPOCHS * BATCHES_PER_EPOCH))
    dis_logged = iter(oracle.other_losses)
    expected_dis = [next(dis_logged) if step % BATCHES_PER_EPOCH in (0, 4, 8) else None for step, _ in dis_rows]
    for i, value in enumerate(expected_dis):
        expected_dis[i] = value if value is not None else expected_dis[i - 1]
    assert [value for _, value in dis_rows] == pytest.approx(expected_dis, rel=1e-5, abs=1e-6)
    gen_epochs = [float(r["loss_gen_epoch"]) for r in records if r["loss_gen_epoch"]]
    per_epoch = [oracle.losses[i : i + BATCHES_PER_EPOCH] for i in range(0, len(oracle.losses), BATCHES_PER_EPOCH)]
    assert gen_epochs == pytest.approx([sum(losses) / len(losses) for losses in per_epoch], rel=1e-5)


# -- accumulate_grad_batches, which Lightning refuses for manual optimization --------------------------------------


@pytest.mark.parametrize(
    ("precision", "clip", "manual_backward"),
    [*((p, None, False) for p in MIXED), ("32-true", 0.05, False), ("16-mixed", None, True)],
    ids=[*MIXED, "32-true-clipped", "16-mixed-manual_backward"],
)
def test_accumulate_grad_batches_windows(
    precision: Precision, clip: float | None, manual_backward: bool, tmp_path: Path
) -> None:
    """``Trainer(accumulate_grad_batches=3)``, 10 batches an epoch: windows 3, 3, 3 and the flushed 1, twice.

    ``Trainer(gradient_clip_val=...)`` clips the window's mean gradient; Lightning's own ``self.manual_backward``
    is scaled by the reference's loss scaler in 16-mixed, as the wrapper's ``backward`` is.
    """
    model = WindowedRegressor(manual_backward=manual_backward)
    trainer = reference_trainer(tmp_path, precision, accumulate_grad_batches=3, gradient_clip_val=clip)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, train_dataloaders=regression_loader())

    data = regression_data()
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    oracle = windows_oracle(precision, batches, WINDOWS, 3, clip=clip)
    assert_params_close(model.net, oracle.model, TOLERANCES[precision], f"windows of 3 in a Trainer, {precision}")
    assert model.outcomes == expected_outcomes(WINDOWS, oracle.stepped)
    assert trainer.global_step == oracle.closing_steps == len(oracle.stepped)
    assert trainer.accumulate_grad_batches == 3, "the Trainer's own argument is given back after fit"
    assert trainer.gradient_clip_val == clip
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.get_last_lr() == pytest.approx([0.1 * 0.5 ** (sum(oracle.stepped) // 2)])
    order_warnings = [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert not order_warnings, [str(w.message) for w in order_warnings]


class SkipsRestOfFirstEpoch(LightningModule):
    """One SGD with momentum over ``Trainer(accumulate_grad_batches=3)``; ``on_train_batch_start`` returns -1 at
    batch 1 of the first epoch, which ends that epoch with a window of one micro-step open (batch 0's)."""

    def __init__(self, automatic: bool) -> None:
        super().__init__()
        self.automatic_optimization = automatic
        self.net = make_model(seed=0)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if self.current_epoch == 0 and batch_idx == 1 else None

    def loss(self, batch: Batch) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        if self.automatic_optimization:
            return self.loss(batch)
        opt = wrapped_optimizers(self, torch.optim.SGD)
        opt.step(closure=lambda: opt.backward(self.loss(batch)))  # make_optimizer_step left to the schedule
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_an_epoch_cut_short_by_on_train_batch_start_flushes_its_window(automatic: bool, tmp_path: Path) -> None:
    """ACC-003: the window that -1 leaves open is flushed (a step on its mean), not carried into the next epoch.

    By hand: epoch 0 runs batch 0 only, so its window is [0]; epoch 1 has windows [0, 1, 2] and [3, 4, 5]. Carried,
    epoch 1's first window would hold four micro-steps and step on their mean.
    """
    model = SkipsRestOfFirstEpoch(automatic)
    trainer = reference_trainer(tmp_path, "32-true", accumulate_grad_batches=3)
    trainer.fit(model, train_dataloaders=regression_loader(batches=6))

    data = regression_data(batches=6)
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    oracle = make_model(seed=0)
    optimizer = torch.optim.SGD(oracle.parameters(), lr=0.1, momentum=0.9)
    for window in ([0], [0, 1, 2], [3, 4, 5]):
        for batch_idx in window:
            x, y = batches[batch_idx]
            torch.nn.functional.mse_loss(oracle(x), y).backward()
        with torch.no_grad():
            for param in oracle.parameters():
                assert param.grad is not None
                param.grad /= len(window)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert_params_close(model.net, oracle, TOLERANCES["32-true"], "an epoch cut short by -1, then a full epoch")
    # Lightning counts optimizer_step calls (automatic: the flush is none) or step() calls that close a window.
    assert trainer.global_step == (2 if automatic else 3)


class HookRecorder(Callback):
    """Lightning's backward and optimizer-step hooks as a callback sees them, gradients at each step included."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.step_grads: list[list[torch.Tensor]] = []

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self.calls.append("before_backward")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.calls.append("after_backward")

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        assert not isinstance(optimizer, WrappedOptimizer), "Lightning hands its hooks the torch optimizer"
        self.calls.append("before_optimizer_step")
        self.step_grads.append([p.grad.detach().clone() for p in pl_module.parameters() if p.grad is not None])


class HookedRegressor(WindowedRegressor):
    """``WindowedRegressor`` that also counts its own module hooks."""

    def __init__(self, manual_backward: bool) -> None:
        super().__init__(manual_backward=manual_backward)
        self.module_calls: list[str] = []

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.module_calls.append("before_backward")

    def on_after_backward(self) -> None:
        self.module_calls.append("after_backward")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.module_calls.append("before_optimizer_step")
        # What gradient-norm logging does in this hook: self.log must work there.
        self.log("grad_norm", torch.nn.utils.get_total_norm([p.grad for p in self.parameters() if p.grad is not None]))


SKIPPING_SCALE = GradScalerSettings(init_scale=2.0**20)
"""A first loss scale at which the first windows' micro-steps, ``scaler.scale(loss / 3)``, overflow."""


@pytest.mark.parametrize("manual_backward", [False, True], ids=["wrapper-backward", "manual_backward"])
def test_lightning_hooks_fire_once_per_backward_and_step(manual_backward: bool, tmp_path: Path) -> None:
    """Module and callbacks get ``on_before_backward``/``on_after_backward`` per backward, in either backward form,
    and ``on_before_optimizer_step`` per real step (one that 16-mixed then skips included, as in Lightning's own
    loop), seeing the gradients the step applies (the window's unscaled mean), as a plain loop has them."""
    model, recorder = HookedRegressor(manual_backward), HookRecorder()
    strategy = ReferenceSingleDeviceStrategy(grad_scaler=SKIPPING_SCALE)
    trainer = reference_trainer(
        tmp_path, "16-mixed", strategy, accumulate_grad_batches=3, max_epochs=1, callbacks=[recorder]
    )
    trainer.fit(model, train_dataloaders=regression_loader())
    data = regression_data()
    batches = [(data.tensors[0][i : i + 4], data.tensors[1][i : i + 4]) for i in range(0, len(data), 4)]
    oracle = windows_oracle("16-mixed", batches, WINDOWS, 3, epochs=1, scaler_settings=SKIPPING_SCALE)
    expected: list[str] = []
    for window in WINDOWS:
        expected += ["before_backward", "after_backward"] * len(window)
        expected += ["before_optimizer_step"]
    assert not all(oracle.stepped), f"16-mixed at {SKIPPING_SCALE} skips the first steps here"
    assert recorder.calls == expected
    assert model.module_calls == expected
    assert "grad_norm" in trainer.callback_metrics, "self.log in on_before_optimizer_step logged nothing"
    assert len(recorder.step_grads) == len(oracle.step_grads)
    tolerance = TOLERANCES["16-mixed"]
    for i, (got, want) in enumerate(zip(recorder.step_grads, oracle.step_grads, strict=True)):
        assert all(
            torch.allclose(a.double(), b.double(), rtol=tolerance.rtol, atol=tolerance.atol, equal_nan=True)
            for a, b in zip(got, want, strict=True)
        ), f"step {i}: on_before_optimizer_step saw other gradients than the plain loop's (scaled? not averaged?)"


# -- DDP: two CPU processes on gloo ----------------------------------------------------------------------------


def global_batches(data: TensorDataset, per_rank: int) -> list[Batch]:
    """Batch k of the run: each rank's k-th batch of its ``DistributedSampler`` shard (no shuffling), in rank order."""
    samplers: list[DistributedSampler[int]] = [
        DistributedSampler(data, num_replicas=2, rank=rank, shuffle=False) for rank in (0, 1)
    ]
    shards = [list(sampler) for sampler in samplers]
    batches = []
    for k in range(len(shards[0]) // per_rank):
        indices = [i for shard in shards for i in shard[per_rank * k : per_rank * (k + 1)]]
        batches.append((data.tensors[0][indices], data.tensors[1][indices]))
    return batches


def assert_equal_on_ranks_and_close(results: list[dict[str, Any]], oracle: torch.nn.Module, what: str) -> None:
    tolerance = REORDERED_TOLERANCES["32-true"]  # the mean of the ranks' shard means: the same value, other order
    for rank, result in enumerate(results):
        for got, want in zip(result["params"], results[0]["params"], strict=True):
            assert torch.equal(got, want), f"{what}: rank {rank}'s parameters differ from rank 0's"
        for got, (name, want) in zip(result["params"], oracle.named_parameters(), strict=True):
            diff = (got - want.detach()).abs().max().item()
            assert torch.allclose(got, want.detach(), rtol=tolerance.rtol, atol=tolerance.atol), (
                f"{what}: rank {rank}'s {name} differs from the plain loop on the global batches by {diff:.3g}"
            )


def test_ddp_two_ranks_one_all_reduce_per_window(tmp_path: Path) -> None:
    """Both ranks end equal, and equal a plain loop on the global batches; a window costs one all-reduce.

    One pair of processes runs three fits: ``accumulate_grad_batches=3`` (whose checkpoint, taken inside a
    window, holds each rank's own accumulated gradients), the proposal's GAN, and ``accumulate_grad_batches=3``
    under automatic optimization.
    """
    run_scenario("ddp", tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]

    windows = [result["windows"] for result in ranks]
    oracle = windows_oracle("32-true", global_batches(regression_data(2, 20), 2), WINDOWS, 3, epochs=1)
    assert_equal_on_ranks_and_close(windows, oracle.model, "accumulate_grad_batches=3 on 2 ranks")
    for rank, result in enumerate(windows):
        assert result["all_reduces"] == len(WINDOWS), f"rank {rank}: {result['all_reduces']} gradient all-reduces"
        assert result["global_step"] == len(WINDOWS)
        assert result["outcomes"] == [outcome.value for outcome in expected_outcomes(WINDOWS, oracle.stepped)]

    checkpoint = torch.load(tmp_path / "mid-window.ckpt", weights_only=False)
    contexts = checkpoint["ReferencePrecision"]["contexts"]
    assert len(contexts) == 2
    for rank, result in enumerate(windows):
        (entry,) = contexts[rank]["optimizers"]
        assert entry["pending"] == 2, "saved after batch 4: two micro-steps into the window [3, 4, 5]"
        for saved, local in zip(entry["grads"], result["grads_at_checkpoint"], strict=True):
            assert torch.equal(saved, local)
    assert not torch.equal(windows[0]["grads_at_checkpoint"][0], windows[1]["grads_at_checkpoint"][0])

    gans = [result["gan"] for result in ranks]
    gan = gan_oracle("32-true", global_batches(gan_data(), GAN_BATCH))
    assert_equal_on_ranks_and_close(gans, gan.model, "the GAN on 2 ranks")
    # A closing micro-step costs one all-reduce: 5 generator windows and 3 discriminator steps an epoch.
    for rank, result in enumerate(gans):
        assert result["all_reduces"] == gan.applied_steps == EPOCHS * (5 + 3), f"rank {rank}: {result['all_reduces']}"
        assert result["global_step"] == gan.closing_steps

    automatic = [result["automatic"] for result in ranks]
    assert_equal_on_ranks_and_close(automatic, oracle.model, "automatic optimization, windows of 3 on 2 ranks")
    for rank, result in enumerate(automatic):
        assert result["all_reduces"] == len(WINDOWS), f"rank {rank}: {result['all_reduces']} gradient all-reduces"
        assert result["global_step"] == len(WINDOWS)
        assert result["outcomes"] == [StepOutcome.STEPPED.value] * len(WINDOWS), "optimizer_step once per window"


# -- checkpoints -----------------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


class SaveInsideWindowThenStop(Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.current_epoch == 0 and batch_idx == RESUME_SAVE_AT:
            trainer.save_checkpoint(self.path)
            raise Interrupted


def test_fsdp_two_ranks_one_reduce_scatter_round_per_window(tmp_path: Path) -> None:
    """``ReferenceFSDPStrategy``, blocks sharded in ``configure_model``: a plain loop's result on the global batches.

    Each window costs one reduce-scatter round (one per sharded ``Linear``) in its closing batch and none elsewhere;
    a checkpoint saved inside the second window records, for each rank, the two micro-steps it holds.
    """
    run_scenario("fsdp", tmp_path)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    oracle = windows_oracle("32-true", global_batches(regression_data(2, 20), 2), WINDOWS, 3, epochs=1)
    assert_equal_on_ranks_and_close(ranks, oracle.model, "ReferenceFSDPStrategy, accumulate_grad_batches=3")
    closing = {window[-1] for window in WINDOWS}
    for rank, result in enumerate(ranks):
        expected = [2 if batch in closing else 0 for batch in range(10)]
        assert result["reduce_scatters"] == expected, f"rank {rank}: reduce-scatters per batch"
        assert result["global_step"] == len(WINDOWS)
        assert result["outcomes"] == [outcome.value for outcome in expected_outcomes(WINDOWS, oracle.stepped)]
        assert result["saved_pending"] == [2, 2], "saved after batch 4: two micro-steps into the window [3, 4, 5]"


def test_resume_inside_a_window_in_a_new_process(tmp_path: Path) -> None:
    """16-mixed GAN saved with the generator's window half full; a fresh process resumes to the same end."""
    uninterrupted, full = run_gan(tmp_path / "full", ResumableBatches(gan_batches()))
    checkpoint_path = tmp_path / "inside-window.ckpt"
    with pytest.raises(Interrupted):
        run_gan(
            tmp_path / "cut", ResumableBatches(gan_batches()), callbacks=[SaveInsideWindowThenStop(checkpoint_path)]
        )

    saved = torch.load(checkpoint_path, weights_only=False)["ReferencePrecision"]
    (context,) = saved["contexts"]
    gen_entry, dis_entry = context["optimizers"]
    assert gen_entry["pending"] == 1, "batch 5 accumulated into the generator's window {5, 6}"
    assert all(grad is not None for grad in gen_entry["grads"])
    assert dis_entry["pending"] == 0
    assert context["scaler"]["scale"] > 0

    output = tmp_path / "resumed.pt"
    run_scenario("resume", checkpoint_path, output, tmp_path / "resumed")
    resumed = torch.load(output)
    assert resumed["global_step"] == full.global_step
    for got, want in zip(resumed["params"], uninterrupted.parameters(), strict=True):
        assert torch.equal(got, want.detach()), "the resumed run left the uninterrupted trajectory"


# -- types and bad input ---------------------------------------------------------------------------------------


def test_optimizers_are_the_reference_wrappers(tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    class Inspect(Callback):
        def on_train_batch_start(
            self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
        ) -> None:
            opt_gen, opt_dis = wrapped_optimizers(pl_module, torch.optim.Adam, torch.optim.SGD)
            seen.update(
                optimizers=pl_module.optimizers(),
                gen=opt_gen,
                dis=opt_dis,
                raw=pl_module.optimizers(use_pl_optimizer=False),
            )
            with pytest.raises(TypeError, match=r"\['Adam', 'SGD'\].*\['SGD', 'Adam'\]"):
                wrapped_optimizers(pl_module, torch.optim.SGD, torch.optim.Adam)

    model = gan_class()()
    trainer = reference_trainer(tmp_path, "32-true", max_epochs=1, limit_train_batches=1, callbacks=[Inspect()])
    trainer.fit(model, train_dataloaders=ResumableBatches(gan_batches()))
    opt_gen, opt_dis = seen["gen"], seen["dis"]
    assert seen["optimizers"] == [opt_gen, opt_dis]
    assert isinstance(opt_gen, WrappedOptimizer)
    assert isinstance(opt_gen, torch.optim.Adam)
    assert isinstance(opt_dis, WrappedOptimizer)
    assert seen["raw"] == [opt_gen.optimizer, opt_dis.optimizer]
    assert trainer.optimizers == [opt_gen.optimizer, opt_dis.optimizer]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda root: reference_trainer(root, "transformer-engine"), ValueError, "not a precision the reference runs"),
        (
            lambda root: reference_trainer(root, "32-true", accumulate_grad_batches=2, gradient_clip_val=-1.0),
            ValueError,
            "gradient_clip_val must be None or a finite positive number",
        ),
        (
            lambda root: reference_trainer(root, "32-true", devices=2),
            ValueError,
            "one device",
        ),
    ],
    ids=["precision", "clip", "devices"],
)
def test_bad_settings_are_refused_before_training(
    make: Any, error: type[Exception], match: str, tmp_path: Path
) -> None:
    model = WindowedRegressor()
    before = [param.detach().clone() for param in model.parameters()]
    trainer = make(tmp_path)
    accumulate = trainer.accumulate_grad_batches
    with pytest.raises(error, match=match):
        trainer.fit(model, train_dataloaders=regression_loader())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert trainer.accumulate_grad_batches == accumulate


@pytest.mark.parametrize(
    ("name", "kind", "start_method", "find_unused"),
    [
        ("reference", ReferenceSingleDeviceStrategy, None, None),
        ("reference_ddp", ReferenceDDPStrategy, "popen", None),
        ("reference_ddp_find_unused_parameters_true", ReferenceDDPStrategy, "popen", True),
        ("reference_ddp_spawn", ReferenceDDPStrategy, "spawn", None),
        ("reference_ddp_spawn_find_unused_parameters_true", ReferenceDDPStrategy, "spawn", True),
        ("reference_fsdp", ReferenceFSDPStrategy, None, None),
    ],
)
def test_strategy_names_are_registered(
    name: str, kind: type[Any], start_method: str | None, find_unused: bool | None
) -> None:
    assert name in STRATEGY_NAMES
    strategy: Any = StrategyRegistry.get(name)
    assert type(strategy) is kind
    if start_method is not None:
        assert strategy._start_method == start_method
        assert strategy._ddp_kwargs.get("find_unused_parameters") is find_unused


def test_trainer_by_strategy_name_accumulates_with_the_wrappers(tmp_path: Path) -> None:
    """``Trainer(strategy="reference")`` is the single-device strategy: wrappers, the Trainer's accumulation."""
    model = WindowedRegressor()
    trainer = reference_trainer(
        tmp_path, "32-true", "reference", accumulate_grad_batches=3, max_epochs=1, limit_train_batches=6
    )
    assert isinstance(trainer.strategy, ReferenceSingleDeviceStrategy)
    trainer.fit(model, train_dataloaders=regression_loader())
    assert model.outcomes == [StepOutcome.ACCUMULATED, StepOutcome.ACCUMULATED, StepOutcome.STEPPED] * 2
    assert trainer.global_step == 2


def test_a_strategy_by_name_keeps_the_reference_precision_plugin(tmp_path: Path) -> None:
    """By name, Lightning chooses the precision before the strategy exists: on the CPU 16-mixed becomes
    bf16-mixed (Lightning warns), and the reference's own plugin runs that precision, checkpoint state included."""
    with pytest.warns(Warning, match="Using `precision='bf16-mixed'` instead"):
        trainer = reference_trainer(tmp_path, "16-mixed", "reference", max_epochs=1, limit_train_batches=2)
    assert isinstance(trainer.precision_plugin, ReferencePrecision)
    probe = ContextProbe()
    trainer.callbacks.append(probe)  # type: ignore[attr-defined]  # the Trainer's own list
    trainer.fit(WindowedRegressor(), train_dataloaders=regression_loader())
    assert trainer.precision == "bf16-mixed"
    assert isinstance(probe.plugin, ReferencePrecision)
    assert probe.scale is None, "bf16-mixed scales no loss"
    strategy = trainer.strategy
    assert isinstance(strategy, ReferenceSingleDeviceStrategy)
    with pytest.raises(ValueError, match="runs its own ReferencePrecision"):
        strategy.precision_plugin = ReferencePrecision()


class ClipsByHand(LightningModule):
    """``manual_backward``, then ``self.clip_gradients(opt, CLIP, "norm")``, then ``opt.step()``, every batch."""

    CLIP = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = make_model(seed=0)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt = wrapped_optimizers(self, torch.optim.SGD)
        x, y = batch
        self.manual_backward(torch.nn.functional.mse_loss(self.net(x).float(), y))
        self.clip_gradients(opt, self.CLIP, "norm")
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_clip_gradients_clips_the_unscaled_gradients(precision: Precision, tmp_path: Path) -> None:
    """Under 16-mixed Lightning's ``clip_gradients`` meets unscaled gradients, as a plain loop's clip does."""
    model = ClipsByHand()
    batches = list(regression_loader())
    reference_trainer(tmp_path, precision, max_epochs=1).fit(model, train_dataloaders=regression_loader())
    oracle = make_model(seed=0)
    optimizer = torch.optim.SGD(oracle.parameters(), lr=1.0)
    scaler = oracle_scaler(precision)
    for x, y in batches:
        with oracle_autocast(precision):
            loss = torch.nn.functional.mse_loss(oracle(x).float(), y)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(oracle.parameters(), ClipsByHand.CLIP)
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
    assert_params_close(model.net, oracle, TOLERANCES[precision], f"clip_gradients under {precision}")


def test_the_strategy_configures_the_loss_scaler(tmp_path: Path) -> None:
    """``grad_scaler=GradScalerSettings(...)`` reaches the context's GradScaler: 2^4, doubled after each step."""
    probe = ContextProbe()
    settings = GradScalerSettings(init_scale=2.0**4, growth_interval=1)
    strategy = ReferenceSingleDeviceStrategy(grad_scaler=settings)
    trainer = reference_trainer(tmp_path, "16-mixed", strategy, max_epochs=1, limit_train_batches=5, callbacks=[probe])
    model = WindowedRegressor()
    trainer.fit(model, train_dataloaders=regression_loader())
    assert model.outcomes == [StepOutcome.STEPPED] * 5
    assert probe.scale == 2.0**4 * 2**5, f"the loss scale is {probe.scale}, not 16 grown after each of 5 steps"


def test_loss_scaler_settings_are_refused_where_they_cannot_apply(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="GradScalerSettings"):
        ReferenceSingleDeviceStrategy(grad_scaler={"init_scale": 4.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="GradScalerSettings"):
        ReferenceDDPStrategy(grad_scaler=GradScaler("cpu"))  # type: ignore[arg-type]
    model = WindowedRegressor()
    before = [param.detach().clone() for param in model.parameters()]
    strategy = ReferenceSingleDeviceStrategy(grad_scaler=GradScalerSettings())
    trainer = reference_trainer(tmp_path, "bf16-mixed", strategy, max_epochs=1)
    with pytest.raises(ValueError, match="16-mixed"):
        trainer.fit(model, train_dataloaders=regression_loader())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class OneXBackward(LightningModule):
    """``self.manual_backward(loss, opt)``, the Lightning 1.x form of the proposal's era."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(4, 2)
        self.backward_hooks = 0

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.backward_hooks += 1

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt = wrapped_optimizers(self, torch.optim.SGD)
        x, y = batch
        self.manual_backward(torch.nn.functional.mse_loss(self.layer(x), y), opt)
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_manual_backward_with_an_optimizer_is_refused_before_autograd(tmp_path: Path) -> None:
    model = OneXBackward()
    before = [param.detach().clone() for param in model.parameters()]
    with pytest.raises(TypeError, match=r"manual_backward\(loss, WrappedSGD\) is Lightning 1.x's form"):
        reference_trainer(tmp_path, "16-mixed", max_epochs=1).fit(model, train_dataloaders=regression_loader())
    assert model.backward_hooks == 1, "Lightning's on_before_backward runs, then the precision plugin refuses"
    assert all(param.grad is None for param in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_lightning_fields_the_reference_touches_are_where_it_expects(tmp_path: Path) -> None:
    """``reference/lightning_compat.py`` against the installed Lightning: a release that moves a field fails here."""
    seen: dict[str, Any] = {}

    class Probe(Callback):
        def on_train_batch_start(
            self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
        ) -> None:
            seen.setdefault("positions", []).append((lightning_compat.loop_position(trainer), batch_idx))
            optimizer = trainer.optimizers[0]
            seen["injected"] = all(hasattr(optimizer, name) for name in lightning_compat.LOOP_INJECTED)
            if batch_idx == 0:
                before = trainer.global_step
                lightning_compat.count_manual_optimizer_step(trainer)
                seen["counted"] = trainer.global_step - before
                lightning_rule = trainer.fit_loop._should_accumulate()
                lightning_compat.decide_accumulation(trainer, lambda rule: not rule())
                seen["decided"] = trainer.fit_loop._should_accumulate() is not lightning_rule
                lightning_compat.forget_accumulation_decision(trainer)
                seen["forgotten"] = trainer.fit_loop._should_accumulate() is lightning_rule
                wrappers = pl_module.optimizers()
                marker = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
                lightning_compat.set_module_optimizers(trainer.strategy, [marker])
                returned: object = pl_module.optimizers()
                seen["module_optimizers"] = returned is marker
                lightning_compat.set_module_optimizers(trainer.strategy, [wrappers])

    trainer = reference_trainer(tmp_path, "16-mixed", max_epochs=1, limit_train_batches=3, callbacks=[Probe()])
    assert lightning_compat.requested_precision(trainer) == "16-mixed"
    assert trainer.precision == "16-mixed", (
        "Lightning's accelerator connector no longer sets strategy.precision_plugin with its precision flag at hand "
        "(lightning_compat.precision_being_settled)"
    )
    assert lightning_compat.precision_being_settled() is None, "outside the connector's call there is no flag"
    model = WindowedRegressor()
    assert lightning_compat.attached_trainer(model) is None
    trainer.fit(model, train_dataloaders=regression_loader())
    assert lightning_compat.attached_trainer(model) is trainer
    assert seen["positions"] == [((0, False), 0), ((1, False), 1), ((2, True), 2)]
    assert seen["injected"], f"Lightning's loop no longer sets {lightning_compat.LOOP_INJECTED} on the optimizers"
    assert seen["counted"] == 1
    assert seen["decided"], "the epoch loop no longer asks _should_accumulate() through its instance"
    assert seen["forgotten"]
    assert seen["module_optimizers"], "LightningModule.optimizers() no longer returns the strategy's list"
    optimizer = trainer.optimizers[0]
    assert not any(hasattr(optimizer, name) for name in lightning_compat.LOOP_INJECTED), "teardown left them"

    # route_accumulating_batches is Lightning's _AutomaticOptimization.run with one branch replaced: the names that
    # method uses are the ones the copy mirrors, and the copy routes the batches Lightning's rule accumulates.
    assert set(_AutomaticOptimization.run.__code__.co_names) == {
        "_block_parallel_sync_behavior",
        "_make_closure",
        "_optimizer_step",
        "_should_accumulate",
        "asdict",
        "consume_result",
        "fit_loop",
        "handles_gradient_accumulation",
        "loss",
        "strategy",
        "trainer",
    }, "Lightning's automatic loop runs a batch differently now: compare lightning_compat.route_accumulating_batches"
    routed: list[int] = []
    stepped: list[int] = []
    done: list[int] = []
    handed: list[tuple[torch.optim.Optimizer, torch.optim.Optimizer]] = []
    zeroed: list[torch.optim.Optimizer] = []

    class Route(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            def micro_step(closure: Any) -> None:
                routed.append(1)
                closure()

            def closure_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
                stand_in = torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # what the zero_grad hooks get
                handed.append((optimizer, stand_in))
                return stand_in

            lightning_compat.route_automatic_batches(
                trainer, micro_step, lambda: done.append(trainer.global_step), closure_optimizer
            )

        def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
            done.append(-1)  # each batch's end comes after the routed batch is done

    class Automatic(AutomaticWindowedRegressor):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            stepped.append(batch_idx)
            optimizer.step(closure=optimizer_closure)

        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
            zeroed.append(optimizer)

    plain = Trainer(
        accelerator="cpu",
        max_epochs=1,
        accumulate_grad_batches=2,
        limit_train_batches=5,
        callbacks=[Route()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    plain.fit(Automatic(), train_dataloaders=regression_loader())
    assert (len(routed), stepped) == (2, [1, 3, 4]), "batches 0 and 2 accumulate; 1, 3 and the last one step"
    assert done == [0, -1, 1, -1, 1, -1, 2, -1, 3, -1], "batch_done after each batch's step, before its end"
    assert plain.global_step == 3
    assert [inner for inner, _ in handed] == [plain.optimizers[0]] * 5, "each batch's closure is built for it"
    assert zeroed == [handed[0][1], handed[2][1], handed[4][1]], "the zero_grad hook gets what the closure was given"
    lightning_compat.forget_automatic_batches(plain)
    assert "run" not in vars(plain.fit_loop.epoch_loop.automatic_optimization)


def test_lightning_hooks_are_called_through_lightnings_dispatch(tmp_path: Path) -> None:
    """``call_hook`` and ``call_module_hook`` call a hook as Lightning's loops do: each callback's then the module's,
    recorded by the Trainer's profiler under Lightning's names, with ``_current_fx_name`` set to the hook."""
    calls: list[tuple[str, str | None]] = []

    class Listener(Callback):
        def on_before_zero_grad(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
            calls.append(("callback", pl_module._current_fx_name))

    class Module(AutomaticWindowedRegressor):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
            optimizer.step(closure=optimizer_closure)  # Lightning's own optimizer: no outcome to record

        def on_before_zero_grad(self, optimizer: Any) -> None:
            calls.append(("module", self._current_fx_name))

        def on_train_start(self) -> None:
            trainer = self.trainer
            lightning_compat.call_hook(trainer, "on_before_zero_grad", trainer.optimizers[0])
            calls.append(("clip", None))
            lightning_compat.call_module_hook(
                trainer, "configure_gradient_clipping", trainer.optimizers[0], gradient_clip_val=None
            )

    trainer = Trainer(
        accelerator="cpu",
        max_steps=1,
        profiler="simple",
        callbacks=[listener := Listener()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Module(), train_dataloaders=regression_loader())
    assert calls[:3] == [("callback", "on_before_zero_grad"), ("module", "on_before_zero_grad"), ("clip", None)]
    recorded = set(trainer.profiler.recorded_durations)  # type: ignore[attr-defined]
    assert f"[Callback]{listener.state_key}.on_before_zero_grad" in recorded
    assert "[LightningModule]Module.on_before_zero_grad" in recorded
    assert "[LightningModule]Module.configure_gradient_clipping" in recorded


def test_the_lightning_fields_are_pinned_to_the_versions_checked() -> None:
    """Each function of ``compat`` names the Lightning versions it was checked on, and the installed Lightning's
    minor release is one of them: a release outside the supported range fails here before it fails in a fit."""
    from importlib.metadata import version

    functions = [name for name in lightning_compat.__all__ if callable(getattr(lightning_compat, name))]
    assert sorted(lightning_compat.CHECKED_ON) == sorted(functions)
    trainer_module = Trainer.__module__.split(".")[0]
    installed = version("pytorch_lightning" if trainer_module == "pytorch_lightning" else "lightning")
    minor = ".".join(installed.split(".")[:2])
    for name, versions in lightning_compat.CHECKED_ON.items():
        assert versions, name
        assert minor in {".".join(checked.split(".")[:2]) for checked in versions}, (
            f"compat.{name} was checked on Lightning {', '.join(versions)}, not on the installed {installed}"
        )


def test_model_parallel_mesh_sizes_are_where_the_fsdp_strategy_sets_them() -> None:
    """``ModelParallelStrategy`` keeps its mesh sizes in two fields that ``set_model_parallel_sizes`` writes."""
    strategy = ReferenceFSDPStrategy()
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == ("auto", "auto")
    lightning_compat.set_model_parallel_sizes(strategy, 2, 1)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 1)
    with pytest.raises(TypeError, match="one data-parallel rank"):
        ReferenceFSDPStrategy(tensor_parallel_size=2)


def test_ddp_strategy_owns_its_precision_plugin() -> None:
    with pytest.raises(TypeError, match=r"set Trainer\(precision=\.\.\.\)"):
        ReferenceDDPStrategy(precision_plugin=ReferencePrecision())


def test_ddp_mixed_precision_is_refused_for_the_trainers_precision() -> None:
    """``DistributedDataParallel(mixed_precision=...)`` would cast parameters and reduce gradients in another dtype
    beside the reference's precision: refused when the strategy is built, naming the Trainer's precision instead."""
    from torch.nn.parallel.distributed import _MixedPrecision

    with pytest.raises(
        TypeError, match=r"ReferenceDDPStrategy\(mixed_precision=\.\.\.\).*Trainer\(precision='bf16-mixed'\)"
    ):
        ReferenceDDPStrategy(mixed_precision=_MixedPrecision(param_dtype=torch.bfloat16))


def test_the_reference_imports_without_lightning() -> None:
    """Only the Lightning packages need Lightning; the reference runs without it."""
    program = "\n".join(
        [
            "import sys",
            "class NoLightning:",
            "    def find_spec(self, name, path=None, target=None):",
            "        if name.split('.')[0] in ('pytorch_lightning', 'lightning', 'lightning_fabric'):",
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)",
            "sys.meta_path.insert(0, NoLightning())",
            "import torch",
            "from lightning_optimizer.reference import TrainingContext",
            "ctx = TrainingContext('16-mixed', 'cpu')",
            "opt = ctx.wrap(torch.optim.SGD(ctx.prepare_module(torch.nn.Linear(2, 1)).parameters(), lr=0.1))",
            "try:",
            "    import lightning_optimizer.reference.lightning",
            "except ModuleNotFoundError as error:",
            "    print('integration needs', error)",
        ]
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert completed.returncode == 0, completed.stderr
    message = completed.stdout.strip()
    assert message.startswith("integration needs lightning_optimizer.reference.lightning needs the lightning"), message
    assert "pip install 'lightning-optimizer[lightning]'" in message, message
