"""Mixed precision through the reference's Lightning strategy, against plain Lightning itself.

Each test trains one ``LightningModule`` twice in a real ``Trainer.fit`` on the CPU, from the same seed and on the
same synthetic batches: on plain Lightning (its own ``MixedPrecision`` plugin) and on
``ReferenceSingleDeviceStrategy``, then compares the parameters and buffers they end with and the gradients each
optimizer step was handed (``on_before_optimizer_step``). Plain Lightning runs real float16 on the CPU only through
``plugins=[MixedPrecision("16-mixed", "cpu", scaler=GradScaler("cpu", ...))]`` (``precision="16-mixed"`` on the CPU
silently becomes bf16-mixed); the reference through ``strategy=ReferenceSingleDeviceStrategy(grad_scaler=...)`` and
``precision="16-mixed"``, with the same scaler settings.

The modules are shortened copies of Lightning's examples (``domain_templates/generative_adversarial_net.py``, the
language model of ``basics/transformer.py`` on ``lightning.pytorch.demos.Transformer``,
``basics/backbone_image_classifier.py``) and modules made for one rule each: PREC-004 (autocast's weight cache is
off), BWD-002 (where a backward runs relative to autocast), AMP-007 (``scaler.scale(loss / N)`` under accumulation).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.demos import Transformer
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning_scenarios.namespace import installed_version
from torch.amp.grad_scaler import GradScaler
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy, wrapped_optimizers
from lightning_optimizer.spec import GradScalerSettings, Precision

MIXED: tuple[Precision, ...] = ("bf16-mixed", "16-mixed")
MODULE_SEED, FIT_SEED = 0, 1

LIGHTNING_CACHES_AUTOCAST_WEIGHTS = installed_version() < (2, 5, 5)
"""Lightning before 2.5.5 autocasts with torch's weight cache on (Lightning's fix: #20921, "no_grad with AMP"), so a
forward after a step in the same ``training_step`` computes with the weights from before the step. The reference's
autocast has the cache off (PREC-004), as Lightning's from 2.5.5 on; on the older releases the plain side runs
Lightning's own plugin with that fix (:class:`UncachedMixedPrecision`), so that the comparison is of the rest."""


class UncachedMixedPrecision(MixedPrecision):
    """Lightning's ``MixedPrecision`` as 2.5.5 made it: autocast without its weight cache."""

    def autocast_context_manager(self) -> torch.autocast:
        dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.half
        return torch.autocast(self.device, dtype=dtype, cache_enabled=False)


Loader = DataLoader[tuple[torch.Tensor, ...]]


# -- running one module on plain Lightning and on the reference ------------------------------------------------


class Recorded(LightningModule):
    """A module that records what each optimizer step is handed, and the loss scale its run ends with."""

    def __init__(self) -> None:
        super().__init__()
        self.step_grads: list[list[torch.Tensor]] = []
        self.final_scale: float | None = None

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Both runs call this hook after unscaling: plain Lightning's MixedPrecision after scaler.unscale_, the
        # reference after the window's preparation (mean, unscaling). Only the stepping optimizer's parameters: the
        # reference clears an optimizer's gradients after its real step (ZERO-001), Lightning leaves them.
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.step_grads.append([p.grad.detach().clone() for p in params if p.grad is not None])

    def on_train_end(self) -> None:
        strategy, plugin = self.trainer.strategy, self.trainer.precision_plugin
        scaler: GradScaler | None = None
        if isinstance(strategy, ReferenceSingleDeviceStrategy):
            context = strategy.reference_context
            assert context is not None
            scaler = context.scaler
        elif isinstance(plugin, MixedPrecision):
            scaler = plugin.scaler
        self.final_scale = None if scaler is None else scaler.get_scale()


M = TypeVar("M", bound=Recorded)


def make_trainer(
    root: Path, precision: Precision, *, reference: bool, scaler: GradScalerSettings | None, **kwargs: Any
) -> Trainer:
    """A quiet CPU Trainer: the reference's strategy, or plain Lightning with its own mixed-precision plugin."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": root,
        **kwargs,
    }
    settings = (scaler or GradScalerSettings()) if precision == "16-mixed" else None
    if reference:
        return Trainer(strategy=ReferenceSingleDeviceStrategy(grad_scaler=settings), precision=precision, **options)
    plugin_class = UncachedMixedPrecision if LIGHTNING_CACHES_AUTOCAST_WEIGHTS else MixedPrecision
    if settings is not None:  # plain Lightning's only real float16 on the CPU
        plugin = plugin_class("16-mixed", "cpu", scaler=GradScaler("cpu", **settings.as_kwargs()))
        return Trainer(plugins=[plugin], **options)
    if precision == "bf16-mixed" and LIGHTNING_CACHES_AUTOCAST_WEIGHTS:
        return Trainer(plugins=[plugin_class("bf16-mixed", "cpu")], **options)
    return Trainer(precision=precision, **options)


def fit(
    make: Callable[[], M],
    loader: Loader,
    precision: Precision,
    root: Path,
    *,
    reference: bool,
    scaler: GradScalerSettings | None = None,
    **kwargs: Any,
) -> tuple[M, Trainer]:
    """One run: the module made and trained from fixed seeds (its initial weights, then dropout's masks)."""
    torch.manual_seed(MODULE_SEED)
    module = make()
    trainer = make_trainer(
        root / ("reference" if reference else "plain"), precision, reference=reference, scaler=scaler, **kwargs
    )
    torch.manual_seed(FIT_SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging intervals
        trainer.fit(module, train_dataloaders=loader)
    assert trainer.precision == precision, f"the run was meant to be {precision}, it was {trainer.precision}"
    return module, trainer


def fit_both(
    make: Callable[[], M],
    loader: Loader,
    precision: Precision,
    root: Path,
    *,
    scaler: GradScalerSettings | None = None,
    **kwargs: Any,
) -> tuple[M, M]:
    """The module trained by plain Lightning, and by the reference, on the same Trainer arguments."""
    plain, _ = fit(make, loader, precision, root, reference=False, scaler=scaler, **kwargs)
    reference, _ = fit(make, loader, precision, root, reference=True, scaler=scaler, **kwargs)
    return plain, reference


def differences(a: nn.Module, b: nn.Module) -> dict[str, float]:
    """``max |a - b|`` of each floating-point entry of the two state dicts (parameters and buffers)."""
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    return {
        name: (value.double() - state_b[name].double()).abs().max().item()
        for name, value in state_a.items()
        if value.is_floating_point()
    }


def assert_same_training(plain: Recorded, reference: Recorded, what: str) -> None:
    """Bit for bit: the final parameters and buffers, and the gradients of every optimizer step."""
    differing = {name: diff for name, diff in differences(plain, reference).items() if diff != 0}
    assert not differing, f"{what}: the reference ends away from plain Lightning by {differing}"
    assert plain.step_grads, f"{what}: no optimizer step ran"
    assert len(reference.step_grads) == len(plain.step_grads), f"{what}: another number of optimizer steps"
    for step, (got, want) in enumerate(zip(reference.step_grads, plain.step_grads, strict=True)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"{what}: gradients of step {step}")
    assert reference.final_scale == plain.final_scale, f"{what}: the loss scales end apart"


def moved(module: nn.Module, make: Callable[[], nn.Module]) -> bool:
    """Whether training changed ``module`` from the initial weights ``make`` builds under the module seed."""
    torch.manual_seed(MODULE_SEED)
    return any(diff > 0 for diff in differences(module, make()).values())


def loader_of(*tensors: torch.Tensor, batch_size: int) -> Loader:
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size)


# -- 1. Lightning's GAN example: manual optimization, two optimizers, the generator stepped mid-region ---------

LATENT, IMAGE = 4, (1, 3, 3)

GAN_SCALER = GradScalerSettings(init_scale=2.0**8, growth_interval=10**6)
"""Plain Lightning updates its GradScaler after each optimizer's step, the reference once per training iteration
(AMP-003): with two optimizers Lightning's growth tracker counts twice as fast, and a backoff after the generator's
step would scale the discriminator's loss of the same iteration by the smaller scale. At a modest scale the tiny
GAN's gradients never overflow (no backoff), and with a growth interval of 10**6 neither scale grows: both runs scale
every loss by 2**8, so the divergence cannot show (``final_scale`` checks that the scale never moved)."""


class GAN(Recorded):
    """Lightning's GAN example, tiny: the generator steps, then runs again for the discriminator's loss.

    ``training_step`` is the example's (``toggle_optimizer``, ``zero_grad``, ``manual_backward``, ``step``), the noise
    comes with the batch instead of ``torch.randn`` inside the step. ``toggle=False`` is the variant without
    ``toggle_optimizer`` (Lightning's manual-optimization docs write it so): the generator's second forward then casts
    parameters that require grad, those autocast's weight cache would keep from before the step (PREC-004).
    """

    def __init__(self, toggle: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.toggle = toggle
        pixels = math.prod(IMAGE)
        self.generator = nn.Sequential(
            nn.Linear(LATENT, 8),
            nn.BatchNorm1d(8, 0.8),
            nn.LeakyReLU(0.2),
            nn.Linear(8, pixels),
            nn.Tanh(),
            nn.Unflatten(1, IMAGE),
        )
        self.discriminator = nn.Sequential(nn.Flatten(), nn.Linear(pixels, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    @contextmanager
    def toggled(self, optimizer: LightningOptimizer) -> Iterator[None]:
        if self.toggle:
            self.toggle_optimizer(optimizer)
        yield
        if self.toggle:
            self.untoggle_optimizer(optimizer)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        imgs, z = batch
        optimizers = self.optimizers()
        assert isinstance(optimizers, list)
        opt_g, opt_d = optimizers
        valid, fake = torch.ones(imgs.size(0), 1), torch.zeros(imgs.size(0), 1)
        with self.toggled(opt_g):
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), valid)
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
        with self.toggled(opt_d):
            real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs), valid)
            fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z).detach()), fake)
            d_loss = (real_loss + fake_loss) / 2
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()

    def configure_optimizers(self) -> tuple[torch.optim.Adam, torch.optim.Adam]:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=0.01, betas=(0.5, 0.999)),
            torch.optim.Adam(self.discriminator.parameters(), lr=0.01, betas=(0.5, 0.999)),
        )


def gan_loader() -> Loader:
    """Four batches of eight "images" in [-1, 1] with their noise."""
    generator = torch.Generator().manual_seed(3)
    images = torch.rand(32, *IMAGE, generator=generator) * 2 - 1
    return loader_of(images, torch.randn(32, LATENT, generator=generator), batch_size=8)


@pytest.mark.parametrize("toggle", [True, False], ids=["toggled", "untoggled"])
@pytest.mark.parametrize("precision", MIXED)
def test_gan_example_matches_plain_lightning(precision: Precision, toggle: bool, tmp_path: Path) -> None:
    """Two epochs of four batches: the same parameters, BatchNorm statistics and step gradients, bit for bit.

    With autocast's weight cache on, the discriminator's two forwards of its step would share one low-precision cast
    whose gradients are summed in bfloat16/float16, and (untoggled) the generator's second forward would run on its
    weights from before the step.
    """
    plain, reference = fit_both(lambda: GAN(toggle), gan_loader(), precision, tmp_path, scaler=GAN_SCALER, max_epochs=2)
    assert_same_training(plain, reference, f"GAN, {precision}")
    assert len(plain.step_grads) == 2 * 2 * 4, "two optimizer steps a batch"
    assert moved(reference, lambda: GAN(toggle))
    if precision == "16-mixed":
        assert plain.final_scale == GAN_SCALER.init_scale, "no step was meant to overflow"


# -- 2. where backward runs: a float32 block inside an autocast forward ----------------------------------------


class BackwardProbe(torch.autograd.Function):
    """The identity; its backward records whether autocast is enabled on the CPU where autograd runs it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seen: list[bool]) -> torch.Tensor:
        ctx.seen = seen
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(torch.is_autocast_enabled("cpu"))
        return grad, None


class Float32Block(nn.Module):
    """A block that leaves autocast (as a norm or a numerically sensitive head does): float32 forward and backward.

    A backward that runs inside autocast autocasts the block's backward too (its matrix products in the low
    precision), so where the backward runs shows in the gradients.
    """

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            return torch.tanh(self.linear(x.float()))


class ProbedRegressor(Recorded):
    """Linear (autocast), a probe, the float32 block, a linear head; one SGD optimizer.

    ``backward``: ``"automatic"`` (automatic optimization, Lightning's loop runs the backward), ``"manual_backward"``
    (``opt.zero_grad(); self.manual_backward(loss); opt.step()``, as plain Lightning users write it) or
    ``"opt.backward"`` (the reference wrapper's ``opt.backward(loss)`` in a closure; no plain Lightning counterpart).
    """

    def __init__(self, backward: str = "automatic") -> None:
        super().__init__()
        self.automatic_optimization = backward == "automatic"
        self.how = backward
        self.inner = nn.Linear(8, 16)
        self.block = Float32Block(16)
        self.head = nn.Linear(16, 1)
        self.seen: list[bool] = []
        """Per backward: whether autocast was enabled where autograd ran it."""

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        probed: torch.Tensor = BackwardProbe.apply(self.inner(x), self.seen)  # type: ignore[no-untyped-call]
        return F.mse_loss(self.head(self.block(probed)).float(), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        if self.how == "automatic":
            return self.loss(batch)
        if self.how == "manual_backward":
            opt = self.optimizers()
            assert not isinstance(opt, list)
            opt.zero_grad()
            self.manual_backward(self.loss(batch))
            opt.step()
            return None
        wrapper = wrapped_optimizers(self, torch.optim.SGD)

        def closure() -> torch.Tensor:
            loss = self.loss(batch)
            wrapper.backward(loss)
            return loss

        wrapper.step(closure)
        return None

    def configure_optimizers(self) -> torch.optim.SGD:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def regression_loader(batches: int = 4) -> Loader:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4 * batches, 8, generator=generator)
    return loader_of(x, x[:, :1] * 2 - x[:, 1:2] + 0.5, batch_size=4)


@pytest.mark.parametrize("precision", MIXED)
def test_automatic_backward_runs_outside_autocast_as_in_lightning(precision: Precision, tmp_path: Path) -> None:
    """Automatic optimization: Lightning runs the backward after ``training_step``, outside autocast; the reference
    evaluates the step's closure inside its autocast region and leaves it for the backward (BWD-002), so the float32
    block's gradients, each step's gradients and the parameters are plain Lightning's, bit for bit."""
    plain, reference = fit_both(ProbedRegressor, regression_loader(), precision, tmp_path)
    assert_same_training(plain, reference, f"a float32 block, automatic optimization, {precision}")
    assert plain.seen == [False] * 4, "plain Lightning's automatic backward runs outside autocast"
    assert reference.seen == plain.seen


@pytest.mark.parametrize("precision", MIXED)
def test_manual_backward_runs_where_lightning_runs_it(precision: Precision, tmp_path: Path) -> None:
    """Manual optimization: ``self.manual_backward`` runs where ``training_step`` calls it, inside Lightning's
    autocast region, in plain Lightning and the reference alike (same gradients, bit for bit); the wrapper's own
    ``opt.backward(loss)`` leaves the region, as torch's AMP recipe runs backward passes."""
    loader = regression_loader(batches=2)
    plain, reference = fit_both(lambda: ProbedRegressor("manual_backward"), loader, precision, tmp_path)
    assert_same_training(plain, reference, f"self.manual_backward, {precision}")
    assert plain.seen == [True, True], "plain Lightning's manual_backward runs inside training_step's autocast"
    assert reference.seen == plain.seen

    wrapper, _ = fit(lambda: ProbedRegressor("opt.backward"), loader, precision, tmp_path / "wrapper", reference=True)
    assert wrapper.seen == [False, False], "opt.backward(loss) runs autograd outside autocast"
    assert len(wrapper.step_grads) == 2


# -- 3. 16-mixed accumulation: each micro-step propagates scaler.scale(loss / N) --------------------------------

ACCUMULATE = 3
WINDOW_SCALER = GradScalerSettings(init_scale=2.0**12, growth_interval=10**6)
"""At 2**12 a micro-step's scaled loss gradient (about 20 an output here) overflows float16 unless divided by 3."""


class FarTargets(Recorded):
    """A bias-free linear layer on inputs in [0, 0.1) against targets near 40: dloss/doutput is about -20 an output.

    Under 16-mixed that gradient enters the float16 layer as ``scale * -20 / 3`` (about -27000, finite) in the recipe,
    as ``scale * -20`` (about -82000: inf in float16) without the division; the weight's gradient, a sum of four
    outputs' gradients times inputs below 0.1, stays finite either way. Without a bias no float16 sum of four
    outputs' gradients (about 109000) overflows.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1, bias=False)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.SGD:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def far_targets_loader() -> Loader:
    """Six batches of four: two full windows of three, so no window is shorter than ``accumulate_grad_batches``.

    (An epoch's last, shorter window is where the two differ by design: Lightning divides its losses by
    ``accumulate_grad_batches`` too, the reference applies that window's own mean.)
    """
    generator = torch.Generator().manual_seed(7)
    x = torch.rand(24, 4, generator=generator) * 0.1
    return loader_of(x, 40 + torch.rand(24, 1, generator=generator) * 2 - 1, batch_size=4)


def first_micro_step_gradient(divisor: int) -> torch.Tensor:
    """The weight's gradient of the first micro-step, its loss backpropagated as ``scale * loss / divisor``."""
    torch.manual_seed(MODULE_SEED)
    module = FarTargets()
    x, y = next(iter(far_targets_loader()))
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
        output = module.net(x)
    (F.mse_loss(output.float(), y) / divisor * WINDOW_SCALER.init_scale).backward()
    grad = module.net.weight.grad
    assert grad is not None
    return grad


def test_16_mixed_applies_the_windows_plain_lightning_applies(tmp_path: Path) -> None:
    """``accumulate_grad_batches=3``: each micro-step's ``scaler.scale(loss / 3)`` is finite in float16 while
    ``scaler.scale(loss)`` is not. Plain Lightning applies both windows; so does the reference (AMP-007), with the
    same step gradients and parameters, bit for bit (a full window is the recipe's sum of ``loss / 3`` gradients)."""
    assert not torch.isfinite(first_micro_step_gradient(1)).all(), "scaler.scale(loss) was meant to overflow"
    assert torch.isfinite(first_micro_step_gradient(ACCUMULATE)).all()

    loader = far_targets_loader()
    plain, plain_trainer = fit(
        FarTargets,
        loader,
        "16-mixed",
        tmp_path,
        reference=False,
        scaler=WINDOW_SCALER,
        accumulate_grad_batches=ACCUMULATE,
    )
    reference, reference_trainer = fit(
        FarTargets,
        loader,
        "16-mixed",
        tmp_path,
        reference=True,
        scaler=WINDOW_SCALER,
        accumulate_grad_batches=ACCUMULATE,
    )
    assert plain.final_scale == WINDOW_SCALER.init_scale, "plain Lightning skipped a window (its scale backed off)"
    assert plain_trainer.global_step == 2
    assert_same_training(plain, reference, "16-mixed, windows of 3")
    assert reference_trainer.global_step == 2, "the reference skipped a window"
    assert all(torch.isfinite(g).all() for grads in reference.step_grads for g in grads)
    assert moved(reference, FarTargets)


# -- 4. Lightning's transformer and image-classifier examples, automatic optimization ---------------------------

VOCAB, SEQUENCE = 16, 6


class LanguageModel(Recorded):
    """``basics/transformer.py``'s ``LanguageModel`` on a tiny ``demos.Transformer`` (its default dropout of 0.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=VOCAB, ninp=8, nhead=2, nhid=16, nlayers=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, target = batch
        output = self.model(inputs, target)
        return F.nll_loss(output, target.view(-1))

    def configure_optimizers(self) -> torch.optim.SGD:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def token_loader() -> Loader:
    """Four batches of four random token sequences, each target its input shifted by one token."""
    tokens = torch.randint(VOCAB, (16, SEQUENCE + 1), generator=torch.Generator().manual_seed(9))
    return loader_of(tokens[:, :-1], tokens[:, 1:], batch_size=4)


class LitClassifier(Recorded):
    """``basics/backbone_image_classifier.py``'s classifier on 8x8 images: its ``Backbone`` (``relu(l2(relu(l1)))``)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Flatten(), nn.Linear(8 * 8, 16), nn.ReLU(), nn.Linear(16, 10), nn.ReLU())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.backbone(x), y)

    def configure_optimizers(self) -> torch.optim.Adam:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def image_loader() -> Loader:
    generator = torch.Generator().manual_seed(13)
    images = torch.rand(32, 1, 8, 8, generator=generator)
    return loader_of(images, torch.randint(10, (32,), generator=generator), batch_size=8)


EXAMPLES: dict[str, tuple[Callable[[], Recorded], Callable[[], Loader], dict[str, Any]]] = {
    # The example trains with gradient_clip_val=0.25: Lightning's configure_gradient_clipping on unscaled gradients.
    "transformer": (LanguageModel, token_loader, {"gradient_clip_val": 0.25}),
    "classifier": (LitClassifier, image_loader, {}),
}


@pytest.mark.parametrize("precision", MIXED)
@pytest.mark.parametrize("example", EXAMPLES)
def test_lightning_examples_match_plain_lightning(example: str, precision: Precision, tmp_path: Path) -> None:
    """Four steps of each example (torch's default loss scaler under 16-mixed, so a first step may be skipped in
    both): the same step gradients and parameters as plain Lightning, bit for bit."""
    make, loader, trainer_kwargs = EXAMPLES[example]
    plain, reference = fit_both(make, loader(), precision, tmp_path, **trainer_kwargs)
    assert_same_training(plain, reference, f"{example}, {precision}")
    assert moved(reference, make)


# -- 5. What users keep in modules: complex and float64 buffers, 16-true, a zero_grad cadence of their own --------


class KeepsGradients(Recorded):
    """A regression head with what Lightning users keep in their modules, and a zeroing cadence of its own.

    A complex buffer used in ``forward`` (rotary-style phases; ``complex_buffer=False`` leaves it out), a float64
    buffer (a statistic kept in float64, which promotes the output), and an ``optimizer_zero_grad`` that zeroes on
    every ``zero_every``-th call only, with ``set_to_none=False``: in between, a step's gradients stay and the next
    window adds to them (Lightning's documented seam for when gradients are cleared).
    """

    phase: torch.Tensor | None
    scale: torch.Tensor

    def __init__(self, *, complex_buffer: bool = True, zero_every: int = 2) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        phase = torch.polar(torch.ones(2), torch.tensor([0.3, -1.1])) if complex_buffer else None
        self.register_buffer("phase", phase)
        self.register_buffer("scale", torch.tensor([1.25, 0.75], dtype=torch.float64))
        self.zero_every = zero_every
        self.zero_calls = 0
        self.zeroed_with: list[torch.optim.Optimizer] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net(x)
        if self.phase is not None:
            real = h.to(torch.promote_types(h.dtype, torch.float32))
            rotated = torch.complex(real, torch.zeros_like(real)) * self.phase
            h = rotated.real + rotated.imag
        scaled: torch.Tensor = h * self.scale
        return scaled

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self(x).float(), y.float())

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        if self.zero_calls % self.zero_every == 0:
            optimizer.zero_grad(set_to_none=False)
            self.zeroed_with.append(optimizer)
        self.zero_calls += 1

    def configure_optimizers(self) -> torch.optim.Adam:
        return torch.optim.Adam(self.parameters(), lr=0.01, eps=1e-4)  # an eps that float16 holds (16-true)


def regression_batches(batches: int = 20) -> Loader:
    generator = torch.Generator().manual_seed(17)
    x = torch.randn(4 * batches, 4, generator=generator)
    return loader_of(x, torch.sin(x[:, :2]) + 0.1 * x[:, 2:], batch_size=4)


def assert_buffers_as_built(module: KeepsGradients, plain: KeepsGradients, what: str) -> None:
    """The complex buffer complex64 and equal to plain Lightning's; the float64 one float64 (PREC-001)."""
    if module.phase is not None:
        assert plain.phase is not None
        assert module.phase.dtype == torch.complex64, f"{what}: the complex buffer became {module.phase.dtype}"
        assert torch.equal(module.phase, plain.phase), f"{what}: the complex buffer differs from plain Lightning's"
    assert module.scale.dtype == plain.scale.dtype, f"{what}: the float64 buffer is {module.scale.dtype}"


@pytest.mark.parametrize("precision", ["64-true", "32-true", "bf16-mixed"])
def test_buffers_and_a_zero_grad_cadence_train_as_on_plain_lightning(precision: Precision, tmp_path: Path) -> None:
    """20 batches, gradients zeroed every other batch: the same parameters and step gradients, bit for bit.

    A step's gradients stay on the odd batches and the next step applies them plus the batch's (plain Lightning's
    ``c + g``; the reference's carried part, ZERO-005, applied as it was). The complex buffer stays complex64 and the
    float64 buffer float64, as Lightning's plugins leave them (PREC-001); only 64-true casts floating tensors.
    """
    plain, reference = fit_both(KeepsGradients, regression_batches(), precision, tmp_path)
    assert_same_training(plain, reference, f"zero every other batch, {precision}")
    assert_buffers_as_built(reference, plain, precision)
    want_scale = torch.float64
    assert reference.scale.dtype == want_scale, f"{precision}: the float64 buffer became {reference.scale.dtype}"
    assert len(reference.step_grads) == 20 and moved(reference, KeepsGradients)


def test_a_window_carries_the_kept_gradients_under_accumulation(tmp_path: Path) -> None:
    """Windows of 2 batches, gradients zeroed at every other window: ``c + (g_1 + g_2) / 2`` on both sides.

    Plain Lightning divides each batch's loss by 2 and adds onto the kept gradients in place; the reference adds the
    carried part to the window's mean: the same to rounding (the sums are added in another order).
    """
    plain, reference = fit_both(KeepsGradients, regression_batches(), "32-true", tmp_path, accumulate_grad_batches=2)
    assert len(reference.step_grads) == len(plain.step_grads) == 10
    for step, (got, want) in enumerate(zip(reference.step_grads, plain.step_grads, strict=True)):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7, msg=f"the gradients of step {step}")
    for name, diff in differences(plain, reference).items():
        assert diff < 1e-5, f"{name} ends {diff} from plain Lightning"


def test_16_true_trains_as_on_plain_lightning(tmp_path: Path) -> None:
    """``Trainer(precision="16-true")``: float16 weights and buffers, no loss scaler; the same training, bit for bit."""
    make = partial(KeepsGradients, complex_buffer=False)
    plain, reference = fit_both(make, regression_batches(), "16-true", tmp_path)
    assert_same_training(plain, reference, "16-true, zero every other batch")
    assert {p.dtype for p in reference.parameters()} == {torch.float16}
    assert reference.scale.dtype == torch.float16 and moved(reference, make)


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_a_half_precision_refuses_a_complex_buffer_that_lightning_makes_real(
    precision: Precision, tmp_path: Path
) -> None:
    """Divergence: plain Lightning's ``module.to(dtype)`` makes the complex buffer real (its imaginary part gone,
    with torch's warning); the reference refuses the module before training, naming the buffer (PREC-002)."""
    plain, _ = fit(KeepsGradients, regression_batches(), precision, tmp_path, reference=False)
    assert plain.phase is not None and not plain.phase.is_complex(), "plain Lightning kept the buffer complex"
    torch.manual_seed(MODULE_SEED)
    module = KeepsGradients()
    trainer = make_trainer(tmp_path / "reference", precision, reference=True, scaler=None)
    with pytest.raises(ValueError, match=r"complex buffer 'phase'"):
        trainer.fit(module, train_dataloaders=regression_batches())
    assert module.phase is not None and module.phase.dtype == torch.complex64, "the refused module was changed"


def test_16_mixed_applies_kept_gradients_unscaled_once(tmp_path: Path) -> None:
    """Divergence: under 16-mixed plain Lightning unscales the kept gradients again with the next window's.

    Its ``scaler.unscale_`` divides the whole ``.grad``, the kept part (unscaled at its own step) included, so the
    second step applies ``g_1 + g_0 / S``; the reference applies ``g_1 + g_0`` (ZERO-005). The first steps agree.
    """
    settings = GradScalerSettings(init_scale=2.0**10)
    plain, reference = fit_both(
        partial(KeepsGradients, complex_buffer=False), regression_batches(4), "16-mixed", tmp_path, scaler=settings
    )
    scale = settings.init_scale
    first_plain, first_reference = plain.step_grads[0], reference.step_grads[0]
    for g, w in zip(first_reference, first_plain, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg="the first step, before anything is kept")
    for kept, got, want in zip(first_reference, reference.step_grads[1], plain.step_grads[1], strict=True):
        torch.testing.assert_close(got - want, kept * (1 - 1 / scale), rtol=1e-3, atol=1e-6)
