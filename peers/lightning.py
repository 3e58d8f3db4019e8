"""Conformance adapter for PyTorch Lightning's ``LightningOptimizer`` (``--impl=lightning_optimizer.peers.lightning``).

A context is a real ``pytorch_lightning.Trainer`` (``barebones=True``) with the strategy (``SingleDeviceStrategy``,
or ``DDPStrategy`` in the suite's process group) and precision plugin (``Precision``, ``DoublePrecision``,
``HalfPrecision``, ``MixedPrecision``) that the Trainer's own connector picks for the cell, and a real
``LightningModule`` in manual optimization that holds the suite's module. ``prepare_module`` runs the steps of
``Trainer.fit`` before its loop (connect, the loop-configuration validator, ``setup_environment``,
``strategy.setup``); ``wrap`` adds the optimizer to ``strategy.optimizers``, as ``configure_optimizers`` would,
and the wrapper is the ``LightningOptimizer`` that ``self.optimizers()`` returns. The suite's loop stands for
``Trainer.fit``'s loop: each ``context.batch(...)`` block is one ``training_step`` and runs under the precision
plugin's ``train_step_context()``. What a manual-optimization user writes in ``training_step`` is in
``TRANSLATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal, TypeVar, cast

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.peers import (
    NoHooks,
    PeerOptimizer,
    ZeroGradDiscard,
    check_clears_after_step,
    check_discard_only,
)
from lightning_optimizer.spec import (
    CONTRACT_VERSION,
    Cell,
    FailurePolicy,
    GradScalerSettings,
    ImplementationInfo,
    Precision,
    StepOutcome,
)

try:
    import pytorch_lightning as pl
    from pytorch_lightning.__version__ import version as LIGHTNING_VERSION
    from pytorch_lightning.accelerators import XLAAccelerator
    from pytorch_lightning.core.optimizer import LightningOptimizer
    from pytorch_lightning.plugins.precision import MixedPrecision
    from pytorch_lightning.trainer.configuration_validator import _verify_loop_configurations
    from pytorch_lightning.trainer.states import TrainerFn, TrainerStatus
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"{__name__} needs pytorch-lightning ({error}): pip install 'lightning-optimizer[peers]'", name=error.name
    ) from error

__all__ = ["NOT_CLAIMED", "TRANSLATIONS", "LightningContext", "conformance_info"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

TRANSLATIONS: dict[str, str] = {
    "context": "a real Trainer(barebones=True, precision=..., strategy='ddp' at world size 2) set up as fit() does "
    "before its loop; a LightningModule with automatic_optimization=False holds the suite's module",
    "wrap": "strategy.optimizers += [optimizer] (what configure_optimizers feeds); the wrapper is the "
    "LightningOptimizer that self.optimizers() returns",
    "batch": "one training_step: the block runs under precision_plugin.train_step_context()",
    "autocast": "precision_plugin.forward_context()",
    "step": "with opt.toggle_model(sync_grad=steps_now): a step is opt.step(closure, **kwargs) then "
    "opt.zero_grad(); an accumulating micro-step only runs the closure (the manual-optimization docs)",
    "make_optimizer_step=None": "the docs' accumulation recipe: step when (batch_idx + 1) % N == 0; outside a "
    "batch, every N-th call",
    "backward": "self.manual_backward(loss / N, ...): the docs' recipe divides the loss by N",
    "last_outcome": "STEPPED when opt.step() was called (Lightning does not report a skipped step), else ACCUMULATED",
    "unscale_gradients": "precision_plugin.scaler.unscale_(opt.optimizer) when there is a scaler (Lightning has "
    "no unscale call of its own in manual optimization)",
    "gradient_clip_val": "self.clip_gradients(opt, gradient_clip_val, gradient_clip_algorithm) after the "
    "backward, before opt.step() (the docs' recipe; the Trainer flag is refused in manual optimization)",
    "toggle_model": "LightningOptimizer.toggle_model(sync_grad)",
    "state_dict": "the precision plugin's state under its class name, as Lightning's checkpoints hold it",
    "on_failure": "'discard' only, and nothing translated: a step() that raises leaves the window as the peer leaves "
    "it",
}
"""Contract call -> what the adapter writes for it (the code a Lightning user writes in ``training_step``)."""

NOT_CLAIMED: dict[str, str] = {
    "xla": "Lightning's XLAAccelerator runs only where it counts TPU chips; XLA's CPU backend is not one, so the "
    "adapter cannot be exercised here and claims no XLA cell",
    "pickling": "LightningOptimizer builds a class per instance, which pickle cannot find; Lightning's Strategy "
    "drops its LightningOptimizers when pickled and rebuilds them",
    "hooks": "Lightning calls its hooks (callbacks and the module's) from inside its own loop; LightningOptimizer "
    "offers none to register from outside",
    "exact_restore": "Lightning keeps no copy of a window to put back when a step fails, so on_failure='restore' is "
    "refused; under 'discard' a failed step leaves the gradients as Lightning leaves them (the adapter adds nothing)",
    "user_zero_grad": "Lightning's documented loop clears the gradients after each step (optimizer.zero_grad()), and "
    "nothing in it keeps the gradients a window carries apart from its own micro-steps, so zero_grad_after_step=False "
    "is refused (ZERO-003)",
}
"""What the adapter does not claim, and why."""

_ACCELERATORS = {"cpu": "cpu", "cuda": "gpu", "xla": "tpu"}

# Each Trainer asks whether TPUs are present, which imports torch_xla (where installed) the first time, and that
# import sets environment variables for the rest of the process. Ask once now, at import.
XLAAccelerator.is_available()


class _SuiteModule(pl.LightningModule):
    """The LightningModule of a context: manual optimization over the suite's module."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net
        self.automatic_optimization = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The suite's module."""
        return self.net(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> None:
        """Never called: the suite's loop drives each step (``context.batch`` is the training step)."""

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """None yet: ``context.wrap`` adds each optimizer to the strategy as it is built."""
        return []


class LightningContext(NoHooks, ZeroGradDiscard):
    """A :class:`~lightning_optimizer.spec.TrainingContext` made of a Lightning Trainer, strategy and module."""

    peer_name = "Lightning's LightningOptimizer"

    def __init__(
        self,
        precision: Precision = "32-true",
        device: str = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> None:
        check_discard_only(on_failure, self.peer_name)
        check_clears_after_step(zero_grad_after_step, self.peer_name)
        self._on_failure: FailurePolicy = "discard"
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        # A configured loss scaler goes in as the docs show: a MixedPrecision plugin holding the GradScaler.
        precision_choice: dict[str, Any] = {"precision": precision}
        if grad_scaler is not None and precision == "16-mixed":
            scaler = GradScaler(device, **grad_scaler.as_kwargs())
            precision_choice = {"plugins": [MixedPrecision("16-mixed", device, scaler=scaler)]}
        self._trainer = pl.Trainer(
            accelerator=_ACCELERATORS.get(device, device),
            devices=world_size,
            strategy="ddp" if world_size > 1 else "auto",
            barebones=True,
            max_epochs=1,
            **precision_choice,
        )
        self._accumulate_grad_batches = accumulate_grad_batches
        self._clip_val = gradient_clip_val
        self._clip_algorithm = gradient_clip_algorithm
        self._module: _SuiteModule | None = None
        self._position: int | None = None

    @property
    def precision(self) -> Precision:
        """The precision the Trainer runs (its connector may have chosen another than the one asked for)."""
        return cast(Precision, self._trainer.precision)

    @property
    def device(self) -> torch.device:
        """The strategy's root device."""
        return self._trainer.strategy.root_device

    @property
    def accumulate_grad_batches(self) -> int:
        """The N of the docs' accumulation recipe (user code: the Trainer flag is refused in manual optimization)."""
        return self._accumulate_grad_batches

    @property
    def on_failure(self) -> FailurePolicy:
        """``"discard"``, the only policy the adapter takes: Lightning keeps no failed window to restore."""
        return self._on_failure

    @property
    def zero_grad_after_step(self) -> bool:
        """``True``, the only setting the adapter takes: the peer's loop clears a real step's gradients [ZERO-003]."""
        return True

    @property
    def trainer(self) -> pl.Trainer:
        """The Trainer."""
        return self._trainer

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Set up a LightningModule over ``module`` as ``Trainer.fit`` does before its loop.

        Returns ``module`` itself, or the strategy's ``DistributedDataParallel`` under DDP.
        """
        if self._module is not None:
            raise RuntimeError("a Lightning Trainer trains one LightningModule: prepare one module per context")
        trainer = self._trainer
        lightning_module = self._module = _SuiteModule(module)
        lightning_module.trainer = trainer
        trainer.strategy._lightning_module = lightning_module
        trainer.state.fn = TrainerFn.FITTING
        trainer.state.status = TrainerStatus.RUNNING
        trainer.training = True
        trainer.strategy.connect(lightning_module)
        _verify_loop_configurations(trainer)
        trainer.strategy.setup_environment()
        trainer.strategy.setup(trainer)
        model = trainer.strategy.model
        return model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else module

    def wrap(self, optimizer: OptimizerT) -> PeerOptimizer[OptimizerT]:
        """Add ``optimizer`` to the strategy's optimizers; wrap the ``LightningOptimizer`` it gets."""
        given: Any = optimizer
        if isinstance(given, PeerOptimizer):
            given = given.peer
        strategy = self._trainer.strategy
        strategy.optimizers = [*strategy.optimizers, given]
        # What LightningModule.optimizers() returns in training_step.
        peer: LightningOptimizer = strategy._lightning_optimizers[-1]
        return PeerOptimizer.adapt(self, peer)

    def autocast(self) -> AbstractContextManager[None]:
        """The precision plugin's forward context."""
        return self._trainer.precision_plugin.forward_context()

    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        """One ``training_step``: under the precision plugin's ``train_step_context()``."""
        self._position = batch_idx
        try:
            with self._trainer.precision_plugin.train_step_context():
                yield
        finally:
            self._position = None

    def state_dict(self) -> dict[str, Any]:
        """What a Lightning checkpoint holds of this context: the precision plugin's state, under its class name."""
        plugin = self._trainer.precision_plugin
        state = plugin.state_dict()
        return {type(plugin).__qualname__: state} if state else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the precision plugin's state as Lightning restores a checkpoint."""
        plugin = self._trainer.precision_plugin
        if type(plugin).__qualname__ in state_dict:
            plugin.load_state_dict(state_dict[type(plugin).__qualname__])

    # -- translations ------------------------------------------------------------------------------------

    def _steps_now(self, wrapper: PeerOptimizer[Any], make_optimizer_step: object) -> bool:
        if make_optimizer_step is not None:
            return bool(make_optimizer_step)
        n = self._accumulate_grad_batches
        if self._position is not None:
            return (self._position + 1) % n == 0
        return (wrapper.micro_steps + 1) % n == 0

    def _peer_step(
        self,
        wrapper: PeerOptimizer[Any],
        closure: Callable[[], Any] | None,
        make_optimizer_step: object,
        kwargs: dict[str, Any],
    ) -> Any:
        peer: LightningOptimizer = wrapper.peer
        steps_now = self._steps_now(wrapper, make_optimizer_step)
        with peer.toggle_model(sync_grad=steps_now):
            if not steps_now:
                result = None if closure is None else closure()
                wrapper.record(StepOutcome.ACCUMULATED)
                return result
            if self._clip_val is None:
                result = peer.step(closure, **kwargs)
            elif closure is None:
                self._clip(peer)
                result = peer.step(**kwargs)
            else:
                result = peer.step(self._clipping(closure, peer), **kwargs)
            peer.zero_grad()
        wrapper.record(StepOutcome.STEPPED)
        return result

    def _clip(self, peer: LightningOptimizer) -> None:
        assert self._module is not None, "prepare the module before stepping"
        # A LightningOptimizer, as the docs pass it (its class derives from the inner optimizer's).
        self._module.clip_gradients(cast(torch.optim.Optimizer, peer), self._clip_val, self._clip_algorithm)

    def _clipping(self, closure: Callable[[], Any], peer: LightningOptimizer) -> Callable[[], Any]:
        def closure_then_clip() -> Any:
            result = closure()
            self._clip(peer)
            return result

        return closure_then_clip

    def _peer_backward(
        self, wrapper: PeerOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        assert self._module is not None, "prepare the module before the backward pass"
        self._module.manual_backward(loss / self._accumulate_grad_batches, *args, **kwargs)

    def _peer_unscale_gradients(self, wrapper: PeerOptimizer[Any]) -> None:
        scaler = getattr(self._trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            scaler.unscale_(wrapper.optimizer)

    def _peer_toggle_model(self, wrapper: PeerOptimizer[Any], sync_grad: bool) -> AbstractContextManager[None]:
        peer: LightningOptimizer = wrapper.peer
        return peer.toggle_model(sync_grad=sync_grad) if self._module is not None else nullcontext()


def _context_for(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> LightningContext:
    return LightningContext(
        cell.precision,
        cell.device,
        accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        grad_scaler=grad_scaler,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[LightningContext]:
    """What Lightning's manual optimization supports, and how the suite builds its contexts."""
    return ImplementationInfo(
        name="PyTorch Lightning (LightningOptimizer, manual optimization)",
        version=LIGHTNING_VERSION,
        contract_version=CONTRACT_VERSION,
        factory=_context_for,
        devices=frozenset({"cpu", "cuda"}),
        precisions=frozenset({"64-true", "32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"}),
        world_sizes=frozenset({1, 2}),
        features=frozenset({"checkpointing", "lr_schedulers", "closure_evaluating_optimizers"}),
    )
