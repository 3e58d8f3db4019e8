"""Conformance adapter for Lightning Fabric's optimizer wrapper (``--impl=lightning_optimizer.peers.fabric``).

A context is a real ``lightning_fabric.Fabric`` for the cell (``strategy='ddp'`` in the suite's process group at
world size 2, after ``fabric.launch()``, which joins the existing group). ``prepare_module`` is
``fabric.setup_module``; ``wrap`` is ``fabric.setup_optimizers`` and the wrapper is the ``_FabricOptimizer`` it
returns. Fabric leaves accumulation, toggling and clipping to user code; what the adapter writes for each is in
``TRANSLATIONS``, following Fabric's documentation (the gradient-accumulation guide and the docstrings of
``no_backward_sync`` and ``clip_gradients``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
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
    from lightning_fabric import Fabric
    from lightning_fabric.__version__ import version as FABRIC_VERSION
    from lightning_fabric.accelerators.xla import XLAAccelerator
    from lightning_fabric.plugins.precision import MixedPrecision
    from lightning_fabric.wrappers import _FabricModule, _FabricOptimizer
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"{__name__} needs lightning_fabric, which ships with pytorch-lightning ({error}): "
        "pip install 'lightning-optimizer[peers]'",
        name=error.name,
    ) from error

__all__ = ["NOT_CLAIMED", "TRANSLATIONS", "FabricContext", "conformance_info"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

TRANSLATIONS: dict[str, str] = {
    "context": "Fabric(accelerator, devices=world size, strategy='ddp' at world size 2, precision); launch() joins "
    "the suite's process group",
    "prepare_module": "fabric.setup_module(module); the suite gets the module it wraps (the DDP module under DDP), "
    "so forward passes run under fabric.autocast()",
    "wrap": "fabric.setup_optimizers(optimizer): the wrapper is Fabric's _FabricOptimizer",
    "autocast": "fabric.autocast()",
    "make_optimizer_step=None": "the docs' recipe: is_accumulating = iteration % N != 0 (iteration: batch_idx, "
    "or this wrapper's call count outside a batch)",
    "step": "a step is optimizer.step(closure, **kwargs) then optimizer.zero_grad(); an accumulating micro-step "
    "runs the closure under fabric.no_backward_sync(model, enabled=True)",
    "backward": "fabric.backward(loss, ...): the docs' recipe does not divide the loss",
    "last_outcome": "STEPPED when optimizer.step() was called (Fabric does not report a skipped step), else "
    "ACCUMULATED",
    "unscale_gradients": "fabric.strategy.precision.unscale_gradients(optimizer.optimizer)",
    "gradient_clip_val": "fabric.clip_gradients(model, optimizer, max_norm=v or clip_val=v) after the backward, "
    "before optimizer.step() (Fabric has no configured clipping)",
    "toggle_model": "fabric.no_backward_sync(model, enabled=not sync_grad); Fabric has no requires_grad toggling",
    "state_dict": "nothing: fabric.save() keeps no state of Fabric's own",
    "on_failure": "'discard' only, and nothing translated: a step() that raises leaves the window as the peer leaves "
    "it",
}
"""Contract call -> what the adapter writes for it (the code a Fabric user writes in their loop)."""

NOT_CLAIMED: dict[str, str] = {
    "xla": "Fabric's XLAAccelerator runs only where it counts TPU chips; XLA's CPU backend is not one, so the "
    "adapter cannot be exercised here and claims no XLA cell",
    "pickling": "_FabricOptimizer builds a class per instance, which pickle cannot find",
    "hooks": "Fabric calls its callbacks only where the user's loop does (fabric.call); _FabricOptimizer offers "
    "no hooks to register",
    "exact_restore": "Fabric keeps no copy of a window to put back when a step fails, so on_failure='restore' is "
    "refused; under 'discard' a failed step leaves the gradients as Fabric leaves them (the adapter adds nothing)",
    "user_zero_grad": "Fabric's documented loop clears the gradients after each step (optimizer.zero_grad()), and "
    "nothing in it keeps the gradients a window carries apart from its own micro-steps, so zero_grad_after_step=False "
    "is refused (ZERO-003)",
}
"""What the adapter does not claim, and why."""

_ACCELERATORS = {"cpu": "cpu", "cuda": "gpu", "xla": "tpu"}

# Each Fabric asks whether TPUs are present, which imports torch_xla (where installed) the first time, and that
# import sets environment variables for the rest of the process. Ask once now, at import.
XLAAccelerator.is_available()


class FabricContext(NoHooks, ZeroGradDiscard):
    """A :class:`~lightning_optimizer.spec.TrainingContext` made of a Lightning Fabric."""

    peer_name = "Fabric's _FabricOptimizer"

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
        self._fabric = Fabric(
            accelerator=_ACCELERATORS.get(device, device),
            devices=world_size,
            strategy="ddp" if world_size > 1 else "auto",
            **precision_choice,
        )
        if world_size > 1:
            self._fabric.launch()
        self._accumulate_grad_batches = accumulate_grad_batches
        self._clip_val = gradient_clip_val
        self._clip_algorithm = gradient_clip_algorithm
        self._modules: list[_FabricModule] = []
        self._position: int | None = None

    @property
    def precision(self) -> Precision:
        """The precision Fabric runs (its connector may have chosen another than the one asked for)."""
        return cast(Precision, self._fabric.strategy.precision.precision)

    @property
    def device(self) -> torch.device:
        """Fabric's device."""
        return self._fabric.device

    @property
    def accumulate_grad_batches(self) -> int:
        """The N of the docs' accumulation recipe (user code: Fabric has no such setting)."""
        return self._accumulate_grad_batches

    @property
    def on_failure(self) -> FailurePolicy:
        """``"discard"``, the only policy the adapter takes: Fabric keeps no failed window to restore."""
        return self._on_failure

    @property
    def zero_grad_after_step(self) -> bool:
        """``True``, the only setting the adapter takes: the peer's loop clears a real step's gradients [ZERO-003]."""
        return True

    @property
    def fabric(self) -> Fabric:
        """The Fabric."""
        return self._fabric

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """``fabric.setup_module(module)``; returns the module it wraps (the DDP module under DDP)."""
        fabric_module = self._fabric.setup_module(module)
        self._modules.append(fabric_module)
        # The public `.module` is the user's module even under DDP; the forward pass runs the DDP module.
        forward_module: torch.nn.Module = fabric_module._forward_module
        return forward_module

    def wrap(self, optimizer: OptimizerT) -> PeerOptimizer[OptimizerT]:
        """``fabric.setup_optimizers(optimizer)``, wrapped."""
        given: Any = optimizer
        if isinstance(given, PeerOptimizer):
            given = given.peer
        peer = self._fabric.setup_optimizers(given)
        return PeerOptimizer.adapt(self, peer)

    def autocast(self) -> AbstractContextManager[None]:
        """``fabric.autocast()``."""
        return cast(AbstractContextManager[None], self._fabric.autocast())

    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        """One iteration of the user's loop, at ``batch_idx`` (Fabric has no notion of it)."""
        self._position = batch_idx
        try:
            yield
        finally:
            self._position = None

    def state_dict(self) -> dict[str, Any]:
        """Nothing: ``fabric.save`` keeps no state of Fabric's own besides what the user passes."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore."""

    # -- translations ------------------------------------------------------------------------------------

    def _steps_now(self, wrapper: PeerOptimizer[Any], make_optimizer_step: object) -> bool:
        if make_optimizer_step is not None:
            return bool(make_optimizer_step)
        iteration = self._position if self._position is not None else wrapper.micro_steps
        return iteration % self._accumulate_grad_batches == 0

    @contextmanager
    def _no_backward_sync(self, enabled: bool) -> Iterator[None]:
        with ExitStack() as stack:
            for module in self._modules:
                stack.enter_context(self._fabric.no_backward_sync(module, enabled=enabled))
            yield

    def _peer_step(
        self,
        wrapper: PeerOptimizer[Any],
        closure: Callable[[], Any] | None,
        make_optimizer_step: object,
        kwargs: dict[str, Any],
    ) -> Any:
        peer: _FabricOptimizer = wrapper.peer
        if not self._steps_now(wrapper, make_optimizer_step):
            with self._no_backward_sync(enabled=True):
                result = None if closure is None else closure()
            wrapper.record(StepOutcome.ACCUMULATED)
            return result
        if self._clip_val is not None and closure is None:
            self._clip(peer)
        elif self._clip_val is not None and closure is not None:
            closure = self._clipping(closure, peer)
        step: Callable[..., Any] = peer.step
        result = step(closure, **kwargs)
        peer.zero_grad()
        wrapper.record(StepOutcome.STEPPED)
        return result

    def _clip(self, peer: _FabricOptimizer) -> None:
        module = self._modules[0] if self._modules else None
        if module is None:
            raise RuntimeError("prepare the module before stepping: fabric.clip_gradients needs it")
        if self._clip_algorithm == "value":
            self._fabric.clip_gradients(module, peer, clip_val=self._clip_val)
        else:
            self._fabric.clip_gradients(module, peer, max_norm=self._clip_val)

    def _clipping(self, closure: Callable[[], Any], peer: _FabricOptimizer) -> Callable[[], Any]:
        def closure_then_clip() -> Any:
            result = closure()
            self._clip(peer)
            return result

        return closure_then_clip

    def _peer_backward(
        self, wrapper: PeerOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._fabric.backward(loss, *args, **kwargs)

    def _peer_unscale_gradients(self, wrapper: PeerOptimizer[Any]) -> None:
        self._fabric.strategy.precision.unscale_gradients(wrapper.optimizer)

    def _peer_toggle_model(self, wrapper: PeerOptimizer[Any], sync_grad: bool) -> AbstractContextManager[None]:
        return self._no_backward_sync(enabled=not sync_grad)


def _context_for(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> FabricContext:
    return FabricContext(
        cell.precision,
        cell.device,
        accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        grad_scaler=grad_scaler,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[FabricContext]:
    """What Fabric supports, and how the suite builds its contexts."""
    return ImplementationInfo(
        name="Lightning Fabric (_FabricOptimizer)",
        version=FABRIC_VERSION,
        contract_version=CONTRACT_VERSION,
        factory=_context_for,
        devices=frozenset({"cpu", "cuda"}),
        precisions=frozenset({"64-true", "32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"}),
        world_sizes=frozenset({1, 2}),
        features=frozenset({"checkpointing", "lr_schedulers", "closure_evaluating_optimizers"}),
    )
