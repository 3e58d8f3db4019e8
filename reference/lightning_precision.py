"""The reference's precision plugin: the slot in Lightning where its :class:`TrainingContext` works.

Module and input dtypes follow Lightning's own plugin for the precision; autocast, loss scaling and the checkpoint
state are the context's. Made by the reference strategies of :mod:`.lightning`, which need ``pytorch-lightning``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning import LightningModule
from pytorch_lightning.plugins.precision import DoublePrecision, HalfPrecision, Precision
from pytorch_lightning.utilities import GradClipAlgorithmType

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.types import Precision as PrecisionName

__all__ = ["ReferencePrecision"]

_STATE_FORMAT = 1


def _dtype_plugin(precision: PrecisionName) -> Precision:
    """Lightning's own plugin for what a precision means for dtypes: module, inputs, default dtype in steps."""
    if precision == "64-true":
        return DoublePrecision()
    if precision in ("bf16-true", "16-true"):
        return HalfPrecision(precision)
    return Precision()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


def _anywhere(context: TrainingContext) -> AbstractContextManager[Any]:
    return nullcontext()


class ReferencePrecision(Precision):
    """Lightning's precision plugin slot, filled by the reference's :class:`TrainingContext`.

    Module and input dtypes follow Lightning's own plugin for the precision (``64-true``, ``bf16-true``, ``16-true``);
    autocast and loss scaling are the context's, applied once. Its checkpoint state is the context's
    ``state_dict()`` (per rank under DDP), so a run resumes with open windows and the loss scaler intact.
    Made by the reference strategies; not passed to the ``Trainer`` on its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.precision = "32-true"
        self._dtypes: Precision = Precision()
        self.context: TrainingContext | None = None
        """The running context: set up by the strategy, ``None`` outside a run."""
        self._rank, self._world_size = 0, 1
        self._pending_state: dict[str, Any] | None = None
        self.wrappers: dict[int, WrappedOptimizer[Any]] = {}
        """The run's wrappers by the ``id`` of their inner optimizer (set by the strategy)."""
        self.step_loss: torch.Tensor | None = None
        """Automatic optimization: the loss the running ``training_step`` returned, for its backward."""
        self.backward_region: Callable[[TrainingContext], AbstractContextManager[Any]] = _anywhere
        """Where Lightning's own backward and its hooks run, relative to the context's autocast (the running loop's)."""

    def configure(self, precision: PrecisionName) -> None:
        """Take on the Trainer's precision (called by the strategy when it connects)."""
        self.precision = precision
        self._dtypes = _dtype_plugin(precision)

    def attach(self, context: TrainingContext | None, rank: int = 0, world_size: int = 1) -> None:
        """Use ``context`` (``None``: the run ended, and with it its loop's backward region) on rank ``rank``."""
        self.context, self._rank, self._world_size = context, rank, world_size
        self._pending_state = None
        if context is None:
            self.backward_region = _anywhere

    def restore_loaded_state(self) -> None:
        """Give the context the state ``load_state_dict`` received, once training starts.

        Lightning clears every gradient (``LightningModule.zero_grad``) after it restores a checkpoint and before
        training starts; the open windows' gradients are put back after that.
        """
        if self.context is not None and self._pending_state is not None:
            contexts, self._pending_state = self._pending_state["contexts"], None
            self.context.load_state_dict(contexts[self._rank])

    # -- dtypes: Lightning's plugin for the precision -----------------------------------------------------

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module to the precision's parameter dtype (before any DDP wrapper is built)."""
        return self._dtypes.convert_module(module)

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point inputs as Lightning does for ``64-true``, ``bf16-true`` and ``16-true``."""
        return self._dtypes.convert_input(data)

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """The default dtype while tensors are created (``Trainer.init_module``)."""
        return self._dtypes.tensor_init_context()

    def module_init_context(self) -> AbstractContextManager[Any]:
        """The default dtype while the module is created (``configure_model``)."""
        return self._dtypes.module_init_context()

    @contextmanager
    def forward_context(self) -> Iterator[None]:
        """Training, validation and prediction steps: the precision's default dtype and the context's autocast."""
        with ExitStack() as stack:
            stack.enter_context(self._dtypes.forward_context())
            if self.context is not None:
                stack.enter_context(self.context.autocast())
            yield

    # -- Lightning's own backward (``self.manual_backward``, the automatic closure's) ---------------------------
    #
    # Lightning's ``Strategy.backward`` calls these three in turn; the reference strategies leave it as it is, so
    # that what wraps or replaces it (a test's mock, another plugin) sees Lightning's own.

    def _backward_region(self) -> AbstractContextManager[Any]:
        return nullcontext() if self.context is None else self.backward_region(self.context)

    def pre_backward(self, tensor: torch.Tensor, module: LightningModule) -> torch.Tensor:  # type: ignore[override]
        """Lightning's hooks, then the context's loss scale (16-mixed), as the wrappers' ``backward`` applies it.

        Under automatic optimization the loss is the training step's own (:attr:`step_loss`): Lightning divides it
        by ``accumulate_grad_batches`` first, and the reference takes the window's mean itself, by the window's
        real length (also when the epoch's last window is shorter). Under 16-mixed the scaled loss is the recipe's
        ``scaler.scale(loss / N)`` either way (AMP-007).
        """
        step_loss, self.step_loss = self.step_loss, None
        with self._backward_region():
            tensor = super().pre_backward(tensor if step_loss is None else step_loss, module)
        return (
            tensor
            if self.context is None
            else self.context.parts.scaling.scale(tensor, self.context.accumulate_grad_batches)
        )

    def backward(  # type: ignore[override]
        self,
        tensor: torch.Tensor,
        model: LightningModule,
        optimizer: torch.optim.Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Lightning's backward, in the running loop's region, as a scaled backward [BWD-002, AMP-008].

        The 1.x form ``manual_backward(loss, opt)`` is refused before autograd runs: ``opt`` would otherwise reach
        ``Tensor.backward`` as its ``gradient`` and fail inside autograd.
        """
        if args and isinstance(args[0], torch.optim.Optimizer):
            raise TypeError(
                f"manual_backward(loss, {type(args[0]).__name__}) is Lightning 1.x's form; Lightning 2 passes "
                "further arguments to Tensor.backward. Call self.manual_backward(loss), or opt.backward(loss) on "
                "the wrapper of that optimizer"
            )
        if self.context is None:
            super().backward(tensor, model, optimizer, *args, **kwargs)
            return
        with self.backward_region(self.context), self.context.parts.scaling.backward():
            super().backward(tensor, model, optimizer, *args, **kwargs)

    def post_backward(self, tensor: torch.Tensor, module: LightningModule) -> torch.Tensor:  # type: ignore[override]
        """Lightning's hooks after the backward, in the running loop's region."""
        with self._backward_region():
            result: torch.Tensor = super().post_backward(tensor, module)
            return result

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """``self.clip_gradients(opt, ...)``: clip what the step will apply, the window's mean, unscaled (once).

        The wrapper's ``unscale_gradients()`` prepares the window first (CLIP-002), so under 16-mixed the clip
        threshold meets unscaled gradients, and the closing ``step()`` does not unscale again. As with
        ``unscale_gradients()``, the next ``step()`` of that optimizer must close its window.
        """
        if clip_val <= 0:
            return
        wrapper = optimizer if isinstance(optimizer, WrappedOptimizer) else self.wrappers.get(id(optimizer))
        if wrapper is not None:
            wrapper.unscale_gradients()
            optimizer = wrapper.optimizer
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    # -- checkpoints -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The context's state (every rank's, gathered on all ranks under DDP); empty outside a run."""
        if self.context is None:
            return {}
        own = _to_cpu(self.context.state_dict())
        if self._world_size == 1:
            contexts: list[Any] = [own]
        else:
            contexts = [None] * self._world_size
            dist.all_gather_object(contexts, own)
        return {"format": _STATE_FORMAT, "precision": self.precision, "contexts": contexts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check a checkpoint's state now; this rank's part reaches the context when training starts."""
        if state_dict.get("format") != _STATE_FORMAT or not isinstance(state_dict.get("contexts"), list):
            raise ValueError(f"not a ReferencePrecision checkpoint state of format {_STATE_FORMAT}")
        contexts = state_dict["contexts"]
        if len(contexts) != self._world_size:
            raise ValueError(
                f"the checkpoint holds the training-context state of {len(contexts)} ranks, this run has "
                f"{self._world_size}: resume with the world size that saved it"
            )
        self._pending_state = state_dict
