"""Lightning's conventions under the reference strategy, with plain Lightning as the oracle.

Each test trains the same LightningModule (same seed, same batches) twice with a real ``Trainer.fit`` on the CPU in
32-true: once on Lightning's default strategy, once on ``ReferenceSingleDeviceStrategy()``. It compares what a user
sees: which hooks ran, at which batch and at which ``trainer.global_step``, the final ``global_step`` and the final
parameters (equal where every window is full; the epoch's last, shorter window is the mean of its own batches under
the reference, and Lightning divides it by the nominal length, a documented divergence).
"""

from __future__ import annotations

import gc
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import GradientAccumulationScheduler

from lightning_optimizer.conformance.harness import make_model
from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_scenarios.shared import regression_loader

Event = tuple[str, int, int]
"""A hook that ran: its name, the batch index it ran at, ``trainer.global_step`` when it ran."""

KINDS = ("lightning", "reference")


def make_trainer(kind: str, root: Path, **kwargs: Any) -> Trainer:
    """A quiet 32-true CPU Trainer: Lightning's default strategy, or the reference's single-device one."""
    options: dict[str, Any] = {
        "max_epochs": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
    }
    options.update(kwargs)
    if kind == "reference":
        options["strategy"] = ReferenceSingleDeviceStrategy()
    return Trainer(accelerator="cpu", devices=1, precision="32-true", default_root_dir=root / kind, **options)


def fit(trainer: Trainer, model: LightningModule, batches: int = 10, *, validation: bool = False) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data loaders' worker-count advice, and the like
        trainer.fit(
            model,
            train_dataloaders=regression_loader(batches=batches),
            val_dataloaders=regression_loader(batches=2) if validation else None,
        )


def params_of(module: torch.nn.Module) -> list[torch.Tensor]:
    return [param.detach().clone() for param in module.parameters()]


def assert_same_params(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def windows(batches: int, every: int) -> list[list[int]]:
    """An epoch's windows by Lightning's rule: ``every`` batches each, the epoch's last batch closing the last."""
    return [list(range(start, min(start + every, batches))) for start in range(0, batches, every)]


# -- automatic optimization ------------------------------------------------------------------------------------


class Recorder(LightningModule):
    """Automatic optimization with every optimization hook recorded as an :data:`Event`.

    ``optimizer_step`` and ``optimizer_zero_grad`` are overridden only to record, then call Lightning's own. One SGD
    with momentum and an LR scheduler of ``interval="step"``, so a scheduler step out of place changes the numbers.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model(seed=0)
        self.events: list[Event] = []
        self.batch = -1

    def record(self, name: str, batch_idx: int | None = None) -> None:
        self.events.append((name, self.batch if batch_idx is None else batch_idx, self.trainer.global_step))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.batch = batch_idx

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.record("training_step", batch_idx)
        return self.loss(batch)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.record("on_before_zero_grad")

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        self.record("optimizer_zero_grad", batch_idx)
        super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.record("on_before_backward")

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.record("on_before_optimizer_step")

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        self.record("optimizer_step", batch_idx)
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.record("on_train_batch_end", batch_idx)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def both(
    tmp_path: Path, make: Callable[[], LightningModule], batches: int = 10, **trainer_kwargs: Any
) -> dict[str, tuple[Any, Trainer]]:
    """``make()`` fitted on Lightning's default strategy and on the reference's, with the same Trainer arguments."""
    runs: dict[str, tuple[Any, Trainer]] = {}
    for kind in KINDS:
        model = make()
        trainer = make_trainer(kind, tmp_path, **trainer_kwargs)
        fit(trainer, model, batches)
        runs[kind] = (model, trainer)
    return runs


def named(events: list[Event], *names: str) -> list[Event]:
    return [event for event in events if event[0] in names]


ACCUMULATIONS = {
    "accumulate-1": (1, 10),
    "accumulate-2": (2, 10),
    "accumulate-3-full-windows": (3, 9),
    "accumulate-3-partial-last-window": (3, 10),
}


@pytest.mark.parametrize(("accumulate", "batches"), ACCUMULATIONS.values(), ids=ACCUMULATIONS)
def test_optimizer_step_runs_once_per_window_as_in_lightning(tmp_path: Path, accumulate: int, batches: int) -> None:
    """``optimizer_step`` at each window's closing batch only, every hook at Lightning's batch and global step."""
    runs = both(tmp_path, Recorder, batches, accumulate_grad_batches=accumulate)
    (lightning, lightning_trainer), (reference, reference_trainer) = runs["lightning"], runs["reference"]

    closing = [window[-1] for window in windows(batches, accumulate)]
    assert [batch for _, batch, _ in named(lightning.events, "optimizer_step")] == closing * 2, "the oracle moved"
    assert reference.events == lightning.events
    assert reference_trainer.global_step == lightning_trainer.global_step == 2 * len(closing)
    if batches % accumulate == 0:
        assert_same_params(params_of(reference), params_of(lightning))


@pytest.mark.parametrize("accumulate", [1, 2, 3], ids=lambda n: f"accumulate-{n}")
def test_optimizer_zero_grad_runs_where_lightning_runs_it(tmp_path: Path, accumulate: int) -> None:
    """``on_before_zero_grad`` then ``optimizer_zero_grad`` at each window's first batch, between its
    ``training_step`` and its backward, handed the torch optimizer, and no ``optimizer_step`` before the window
    closes."""
    runs = both(tmp_path, Recorder, 10, accumulate_grad_batches=accumulate)
    lightning, reference = runs["lightning"][0], runs["reference"][0]

    order = ("training_step", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward", "optimizer_step")
    first = [window[0] for window in windows(10, accumulate)]
    assert [batch for _, batch, _ in named(lightning.events, "optimizer_zero_grad")] == first * 2, "the oracle moved"
    assert named(reference.events, *order) == named(lightning.events, *order)


class CountingSGD(torch.optim.SGD):
    """SGD that counts the calls of its ``zero_grad`` and ``step``, as an optimizer subclass of a user's would."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.calls = {"zero_grad": 0, "step": 0}

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls["zero_grad"] += 1
        super().zero_grad(set_to_none)

    def step(self, closure: Any = None) -> Any:
        self.calls["step"] += 1
        return super().step(closure)


class WithCountingSGD(Recorder):
    def configure_optimizers(self) -> Any:
        self.counting = CountingSGD(self.net.parameters(), lr=0.1, momentum=0.9)
        return self.counting


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_inner_optimizer_sees_lightnings_calls_only(tmp_path: Path, accumulate: int) -> None:
    """The inner optimizer's ``zero_grad`` and ``step`` are called as often as under Lightning: the context clears
    the gradients after a real step (ZERO-001) without calling the optimizer's ``zero_grad``."""
    runs = both(tmp_path, WithCountingSGD, 10, accumulate_grad_batches=accumulate)
    lightning, reference = runs["lightning"][0].counting.calls, runs["reference"][0].counting.calls
    steps = 2 * len(windows(10, accumulate))  # two epochs of 10 batches: one zero_grad and one step per window
    assert lightning == {"zero_grad": steps, "step": steps}, "the oracle moved"
    assert reference == lightning


@pytest.mark.parametrize("kind", KINDS)
def test_the_strategy_outside_a_fit_runs_lightnings_training_step(tmp_path: Path, kind: str) -> None:
    """After ``fit`` (a loop driven by hand, as Lightning's own tests drive one) ``training_step`` is Lightning's."""
    model, trainer = both(tmp_path, Recorder, 4)[kind]
    batch = next(iter(regression_loader(batches=1)))
    with torch.no_grad():
        want = model.loss(batch)
        got = trainer.strategy.training_step(batch, 0)
    torch.testing.assert_close(got, want)
    assert model.events[-1] == ("training_step", 0, trainer.global_step)


class SteppingEveryOtherBatch(Recorder):
    """An ``optimizer_step`` that runs the closure every batch, but steps only at odd batches."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        self.record("optimizer_step", batch_idx)
        if batch_idx % 2 == 0:
            optimizer_closure()
        else:
            optimizer.step(closure=optimizer_closure)


def test_global_step_counts_optimizer_step_calls_as_lightning_does(tmp_path: Path) -> None:
    """Lightning counts each ``optimizer_step`` of a batch that does not accumulate, a step taken or not."""
    runs = both(tmp_path, SteppingEveryOtherBatch, 10)
    (lightning, lightning_trainer), (reference, reference_trainer) = runs["lightning"], runs["reference"]

    assert lightning_trainer.global_step == 20, "the oracle moved"
    assert reference_trainer.global_step == 20
    assert reference.events == lightning.events
    assert_same_params(params_of(reference), params_of(lightning))


def test_gradient_accumulation_scheduler_sets_the_windows_as_in_lightning(tmp_path: Path) -> None:
    """``GradientAccumulationScheduler({0: 1, 1: 2})``: every batch a window, then windows of two."""
    runs = {
        kind: both(tmp_path / kind, Recorder, 10, callbacks=[GradientAccumulationScheduler({0: 1, 1: 2})])[kind]
        for kind in KINDS
    }
    (lightning, lightning_trainer), (reference, reference_trainer) = runs["lightning"], runs["reference"]

    assert [batch for _, batch, _ in named(lightning.events, "optimizer_step")] == [*range(10), 1, 3, 5, 7, 9]
    assert reference.events == lightning.events
    assert reference_trainer.global_step == lightning_trainer.global_step == 15
    assert_same_params(params_of(reference), params_of(lightning))


class StepWithoutClosure(Recorder):
    """An ``optimizer_step`` that forgets the closure: ``optimizer.step()``."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        self.record("optimizer_step", batch_idx)
        optimizer.step()


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_without_the_closure_is_refused_as_in_lightning(tmp_path: Path, kind: str) -> None:
    """Lightning's ``MisconfigurationException``, and the reference's names the fix and steps nothing first.

    With windows of two, the window's first batch accumulated; Lightning steps on that half window before it finds
    the closure never ran, the reference refuses the step before it is taken.
    """
    model = StepWithoutClosure()
    initial = params_of(model)
    trainer = make_trainer(kind, tmp_path, accumulate_grad_batches=2)
    with pytest.raises(MisconfigurationException, match="The closure hasn't been executed") as raised:
        fit(trainer, model)

    assert named(model.events, "optimizer_step") == [("optimizer_step", 1, 0)]
    stepped = any(not torch.equal(a, b) for a, b in zip(params_of(model), initial, strict=True))
    if kind == "lightning":
        assert stepped, "the oracle moved: Lightning applied the half window"
        return
    assert "optimizer.step(closure=optimizer_closure)" in str(raised.value)
    assert not stepped, "the reference stepped before refusing"


class ReusedOptimizer(Recorder):
    """``configure_optimizers`` returns the same torch optimizer object in every fit."""

    def __init__(self) -> None:
        super().__init__()
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        self.strict = True

    def configure_optimizers(self) -> Any:
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(self.optimizer)
        config = {"scheduler": scheduler, "monitor": "val_loss", "strict": self.strict}
        return {"optimizer": self.optimizer, "lr_scheduler": config}


@pytest.mark.parametrize("trainer_again", [False, True], ids=["new-trainer", "same-trainer"])
def test_the_same_optimizer_object_in_a_second_fit(tmp_path: Path, trainer_again: bool) -> None:
    """A second fit of the module, by a new Trainer or the same one, steps the same optimizer object further."""
    final: dict[str, list[torch.Tensor]] = {}
    for kind in KINDS:
        model = ReusedOptimizer()
        trainer = make_trainer(kind, tmp_path, max_epochs=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, regression_loader(), regression_loader(batches=2))
        first = params_of(model)
        if trainer_again:
            trainer.fit_loop.max_epochs = 2
        else:
            trainer = make_trainer(kind, tmp_path, max_epochs=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model, regression_loader(), regression_loader(batches=2))
        assert trainer.optimizers[0] is model.optimizer
        assert any(not torch.equal(a, b) for a, b in zip(params_of(model), first, strict=True))
        final[kind] = params_of(model)
    assert_same_params(final["reference"], final["lightning"])


def test_an_optimizer_refused_by_a_failed_fit_is_wrapped_again(tmp_path: Path) -> None:
    """Lightning's ``test_lr_scheduler_strict``: a strict scheduler's missing monitor fails the first fit at the
    epoch's end; the next fit, with the same optimizer object and a lenient scheduler, trains as in Lightning."""
    final: dict[str, list[torch.Tensor]] = {}
    for kind in KINDS:
        model = ReusedOptimizer()
        with pytest.raises(MisconfigurationException, match="val_loss"):
            fit(make_trainer(kind, tmp_path, max_epochs=1), model)
        model.strict = False
        fit(make_trainer(kind, tmp_path, max_epochs=1), model)
        final[kind] = params_of(model)
    assert_same_params(final["reference"], final["lightning"])


def test_a_torn_down_context_is_collected_without_the_cycle_collector(tmp_path: Path) -> None:
    """Nothing of the strategy, the Trainer or the module keeps the fit's context once the fit is over."""
    model = ReusedOptimizer()
    model.strict = False
    trainer = make_trainer("reference", tmp_path, max_epochs=1)
    gc.collect()
    gc.disable()
    try:
        fit(trainer, model)
        assert not isinstance(model.optimizers(), WrappedOptimizer), "the module still hands out the fit's wrapper"
        assert trainer.strategy.reference_context is None  # type: ignore[attr-defined]
        from lightning_optimizer.reference.context import TrainingContext

        TrainingContext("32-true", "cpu").wrap(model.optimizer)  # refused while the fit's context lives [ERR-010]
    finally:
        gc.enable()


class LBFGSRegressor(Recorder):
    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.net.parameters(), lr=0.1, max_iter=3)


def test_lbfgs_under_accumulation_is_refused_before_training(tmp_path: Path) -> None:
    """Lightning runs LBFGS over windows of two (its re-evaluations add onto the window); the reference refuses it
    before the first batch, saying why and what to set. Without accumulation both train it alike (Lightning calls
    ``on_before_optimizer_step`` after each evaluation, the reference once before the step: left out here)."""
    lightning = LBFGSRegressor()
    fit(make_trainer("lightning", tmp_path, accumulate_grad_batches=2), lightning)
    assert lightning.trainer.global_step == 10, "the oracle moved"

    refused = LBFGSRegressor()
    with pytest.raises(ValueError, match=r"Trainer\(accumulate_grad_batches=1\)") as raised:
        fit(make_trainer("reference", tmp_path, accumulate_grad_batches=2), refused)
    assert "Lightning" in str(raised.value)
    assert "accumulated gradients" in str(raised.value)
    assert not named(refused.events, "training_step"), "training started before the refusal"

    runs = both(tmp_path, LBFGSRegressor, 10)
    hooks = ("training_step", "on_before_zero_grad", "optimizer_zero_grad", "optimizer_step", "on_train_batch_end")
    assert named(runs["reference"][0].events, *hooks) == named(runs["lightning"][0].events, *hooks)
    assert_same_params(params_of(runs["reference"][0]), params_of(runs["lightning"][0]))


# -- manual optimization: two optimizers, a window open across validation ----------------------------------------


class TwoOptimizers(LightningModule):
    """Manual optimization with two heads: SGD steps every batch, Adam accumulates over two batches.

    On the reference Adam's window is the reference's (``make_optimizer_step=False`` keeps it open, the window's
    mean is applied); on plain Lightning it is the user's own (the loss halved, ``step()`` every other batch, then
    ``zero_grad()``). Validation runs after batch 4, inside an Adam window. ``keep_grads_for_validation`` overrides
    ``on_validation_model_zero_grad`` so that plain Lightning keeps the window too.
    """

    def __init__(self, keep_grads_for_validation: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.head_a = make_model(seed=0)
        self.head_b = make_model(seed=1)
        self.keep_grads_for_validation = keep_grads_for_validation
        self.steps_at: list[tuple[int, int]] = []
        """``(batch_idx, trainer.global_step)`` after each batch."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        optimizers: Any = self.optimizers()  # the reference's wrappers, or Lightning's LightningOptimizers
        opt_a, opt_b = optimizers
        x, y = batch
        loss_a = torch.nn.functional.mse_loss(self.head_a(x), y)
        opt_a.zero_grad()
        self.manual_backward(loss_a)
        opt_a.step()
        closes = batch_idx % 2 == 1
        loss_b = torch.nn.functional.mse_loss(self.head_b(x), y)
        if isinstance(opt_b, WrappedOptimizer):
            self.manual_backward(loss_b)
            opt_b.step(make_optimizer_step=closes)
        else:
            self.manual_backward(loss_b / 2)
            if closes:
                opt_b.step()
                opt_b.zero_grad()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.steps_at.append((batch_idx, self.trainer.global_step))

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.head_b(x), y))

    def on_validation_model_zero_grad(self) -> None:
        if not self.keep_grads_for_validation:
            super().on_validation_model_zero_grad()

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.head_a.parameters(), lr=0.1, momentum=0.9),
            torch.optim.Adam(self.head_b.parameters(), lr=0.01),
        ]


def test_validation_keeps_an_open_manual_window(tmp_path: Path) -> None:
    """A window open across a validation run keeps its gradients; global steps as Lightning counts step() calls.

    The oracle is plain Lightning told to keep its gradients for validation; with Lightning's default
    ``on_validation_model_zero_grad`` the manual window loses its first batch (that run differs: a sanity check).
    """
    runs: dict[str, tuple[TwoOptimizers, Trainer]] = {}
    for kind, keep in (("lightning", True), ("lightning-cleared", False), ("reference", False)):
        model = TwoOptimizers(keep_grads_for_validation=keep)
        trainer = make_trainer(kind.split("-")[0], tmp_path / kind, val_check_interval=5)
        fit(trainer, model, validation=True)
        runs[kind] = (model, trainer)
    (lightning, lightning_trainer), (reference, reference_trainer) = runs["lightning"], runs["reference"]

    assert lightning_trainer.global_step == 2 * (10 + 5), "the oracle moved: one count per step() call"
    assert reference_trainer.global_step == lightning_trainer.global_step
    assert reference.steps_at == lightning.steps_at
    assert_same_params(params_of(reference), params_of(lightning))
    cleared = params_of(runs["lightning-cleared"][0])
    assert any(not torch.equal(a, b) for a, b in zip(cleared, params_of(lightning), strict=True)), (
        "validation did not run inside a window"
    )


# -- what Lightning's profiler records, the Trainer's callbacks, the LR finder ----------------------------------------


class Listener(Callback):
    """A callback with the optimization hooks (Lightning profiles every callback's hooks, overridden or not)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        """``trainer.callbacks`` (their class names) at each ``on_train_batch_end``."""

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.seen.append([type(callback).__name__ for callback in trainer.callbacks])  # type: ignore[attr-defined]


def profiled(trainer: Trainer) -> dict[str, int]:
    """What ``Trainer(profiler="simple")`` recorded: each action's name and how often it ran.

    The strategy's own class name (``[Strategy]SingleDeviceStrategy...``) is the one difference by construction.
    """
    recorded: dict[str, list[float]] = trainer.profiler.recorded_durations  # type: ignore[attr-defined]
    strategy = type(trainer.strategy).__name__
    return {name.replace(f"[Strategy]{strategy}.", "[Strategy]"): len(times) for name, times in recorded.items()}


@pytest.mark.parametrize(
    ("make", "trainer_kwargs"),
    [
        (Recorder, {"accumulate_grad_batches": 3, "gradient_clip_val": 0.5}),
        (lambda: TwoOptimizers(keep_grads_for_validation=True), {}),
    ],
    ids=["automatic-accumulate-3-clipped", "manual-two-optimizers"],
)
def test_the_profiler_records_the_hooks_that_lightning_records(
    tmp_path: Path, make: Callable[[], LightningModule], trainer_kwargs: dict[str, Any]
) -> None:
    """Every hook the reference calls goes through Lightning's dispatch: ``Trainer(profiler="simple")`` records the
    same actions, as often, as on plain Lightning (``on_before_backward``, ``on_after_backward``,
    ``on_before_optimizer_step``, ``configure_gradient_clipping``, ... of the module and of each callback), and no
    callback of the reference's appears in ``trainer.callbacks``."""
    runs: dict[str, tuple[Trainer, Listener]] = {}
    for kind in KINDS:
        listener = Listener()
        trainer = make_trainer(kind, tmp_path, profiler="simple", callbacks=[listener], **trainer_kwargs)
        model = make()
        fit(trainer, model, validation=isinstance(model, TwoOptimizers))
        runs[kind] = (trainer, listener)
    (lightning, lightning_listener), (reference, reference_listener) = runs["lightning"], runs["reference"]

    hooks = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
    assert all(any(name.endswith(hook) for name in profiled(lightning)) for hook in hooks), "the oracle moved"
    assert profiled(reference) == profiled(lightning)
    assert reference_listener.seen == lightning_listener.seen
    assert [type(c) for c in reference.callbacks] == [type(c) for c in lightning.callbacks]  # type: ignore[attr-defined]


class FindsLearningRate(Recorder):
    """``Recorder`` with a ``learning_rate`` for ``Tuner.lr_find``, recording what ``optimizer_step`` is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.learning_rate = 0.1
        self.handed: list[tuple[type, bool]] = []
        """Per ``optimizer_step``: the optimizer's type, and whether it wraps (or is) the configured optimizer."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        inner = optimizer.optimizer if isinstance(optimizer, WrappedOptimizer) else optimizer._optimizer
        self.handed.append((type(optimizer), inner is self.trainer.optimizers[0]))
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.net.parameters(), lr=self.learning_rate, momentum=0.9)


def test_the_lr_finder_runs_on_the_wrappers_and_finds_what_lightning_finds(tmp_path: Path) -> None:
    """``Tuner.lr_find`` gives the strategy back the configured optimizer object (with its learning rates set for
    the search), so its steps run on that optimizer's wrapper; the search's learning rates and losses, the
    suggestion and the model afterwards are plain Lightning's."""
    from lightning.pytorch.tuner.tuning import Tuner

    found: dict[str, Any] = {}
    for kind in KINDS:
        model = FindsLearningRate()
        trainer = make_trainer(kind, tmp_path, max_epochs=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = Tuner(trainer).lr_find(
                model, train_dataloaders=regression_loader(batches=30), num_training=20, early_stop_threshold=None
            )
        assert result is not None
        found[kind] = (model, result)
    (lightning, lightning_result), (reference, reference_result) = found["lightning"], found["reference"]

    assert len(reference.handed) == 20
    assert all(kind is not WrappedOptimizer and issubclass(kind, WrappedOptimizer) for kind, _ in reference.handed)
    assert all(configured for _, configured in reference.handed), "a step ran on another optimizer than configured"
    assert reference_result.results["lr"] == lightning_result.results["lr"]
    torch.testing.assert_close(reference_result.results["loss"], lightning_result.results["loss"])
    assert reference_result.suggestion() == lightning_result.suggestion()
    assert reference.learning_rate == lightning.learning_rate
    assert_same_params(params_of(reference), params_of(lightning))


# -- the zeroing convention of each mode ------------------------------------------------------------------------


class ManualWithoutZeroGrad(LightningModule):
    """Manual optimization that steps every batch and calls ``opt.zero_grad()`` only when ``zeroes`` (Lightning's
    documented form); the gradients each step is handed, and those left after it, are recorded."""

    def __init__(self, zeroes: bool) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = make_model(seed=0)
        self.zeroes = zeroes
        self.left_after_step: list[bool] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt = self.optimizers()
        assert isinstance(opt, torch.optim.Optimizer)
        x, y = batch
        if self.zeroes:
            opt.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self.net(x), y))
        opt.step()
        self.left_after_step.append(any(p.grad is not None for p in self.net.parameters()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)


def test_manual_steps_clear_their_gradients_where_lightning_leaves_them(tmp_path: Path) -> None:
    """Divergence: under manual optimization a real step clears the gradients it applied (ZERO-001, the proposal's
    "applies zero_grad"); plain Lightning leaves them until the module's ``opt.zero_grad()``.

    A module that zeroes before each backward (Lightning's documented form) trains the same on both; one that never
    zeroes accumulates every batch's gradient into every later step on plain Lightning, and gets fresh windows from
    the reference, which therefore trains as the zeroing module does.
    """
    trained: dict[tuple[str, bool], ManualWithoutZeroGrad] = {}
    for kind in KINDS:
        for zeroes in (True, False):
            model = ManualWithoutZeroGrad(zeroes)
            fit(make_trainer(kind, tmp_path / str(zeroes), max_epochs=1), model)
            trained[kind, zeroes] = model
    assert_same_params(params_of(trained["reference", True]), params_of(trained["lightning", True]))
    assert_same_params(params_of(trained["reference", False]), params_of(trained["lightning", True]))
    assert all(trained["lightning", False].left_after_step), "plain Lightning leaves a step's gradients"
    assert not any(trained["reference", False].left_after_step), "the reference clears a real step's gradients"
    drift = [
        (a - b).abs().max().item()
        for a, b in zip(params_of(trained["lightning", False]), params_of(trained["lightning", True]), strict=True)
    ]
    assert max(drift) > 1e-3, "on plain Lightning the module that never zeroes trains differently"


class SeesZeroGradOptimizer(Recorder):
    """Records the optimizer object ``on_before_zero_grad`` and ``optimizer_zero_grad`` are handed."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[torch.optim.Optimizer] = []

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.handed.append(optimizer)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        self.handed.append(optimizer)
        optimizer.zero_grad()


def test_the_zero_grad_hooks_are_handed_the_wrapper(tmp_path: Path) -> None:
    """Divergence: ``on_before_zero_grad`` and ``optimizer_zero_grad`` get the reference's wrapper of the optimizer
    (an instance of its class, ``opt.optimizer`` the optimizer itself), where plain Lightning hands them the
    optimizer: its ``zero_grad()`` is how the context learns that a step's gradients are cleared (ZERO-005)."""
    seen: dict[str, tuple[list[torch.optim.Optimizer], torch.optim.Optimizer]] = {}
    for kind in KINDS:
        model = SeesZeroGradOptimizer()
        trainer = make_trainer(kind, tmp_path, max_epochs=1)
        fit(trainer, model, batches=4)
        seen[kind] = (model.handed, trainer.optimizers[0])
    handed, inner = seen["lightning"]
    assert handed and all(optimizer is inner for optimizer in handed)
    handed, inner = seen["reference"]
    wrappers = [optimizer for optimizer in handed if isinstance(optimizer, WrappedOptimizer)]
    assert handed and wrappers == handed, "the zero_grad hooks were handed something else than the wrapper"
    assert all(wrapper.optimizer is inner and isinstance(wrapper, type(inner)) for wrapper in wrappers)


def test_manual_accumulation_and_clipping_run_where_lightning_refuses_them(tmp_path: Path) -> None:
    """Divergence: ``Trainer(accumulate_grad_batches=..., gradient_clip_val=...)`` under manual optimization. Plain
    Lightning refuses each; the reference applies them (``make_optimizer_step`` left out closes the Trainer's
    windows, each window's mean is clipped), as ``tests/test_lightning.py`` checks against plain loops."""
    for option in ({"accumulate_grad_batches": 2}, {"gradient_clip_val": 0.5}):
        with pytest.raises(MisconfigurationException, match="manual optimization"):
            fit(make_trainer("lightning", tmp_path, max_epochs=1, **option), ManualWithoutZeroGrad(zeroes=True))
        model = ManualWithoutZeroGrad(zeroes=True)
        trainer = make_trainer("reference", tmp_path, max_epochs=1, **option)
        fit(trainer, model, batches=10)
        assert trainer.global_step == (5 if "accumulate_grad_batches" in option else 10)
