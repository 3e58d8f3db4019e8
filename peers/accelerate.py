"""Conformance adapter for Accelerate's ``AcceleratedOptimizer`` (``--impl=lightning_optimizer.peers.accelerate``).

A context is a real ``accelerate.Accelerator(mixed_precision=..., cpu=..., gradient_accumulation_steps=N)``.
``prepare_module`` and ``wrap`` are ``accelerator.prepare``; the wrapper is the ``AcceleratedOptimizer`` it
returns. The suite's loop is the user's loop of Accelerate's documentation: each ``context.batch(...)`` block
takes the next batch of a dataloader prepared with ``accelerate.data_loader.prepare_data_loader`` (so Accelerate
itself learns, one batch ahead, that a batch is the last of the epoch) and runs inside
``accelerator.accumulate(model)``. What the adapter writes for each contract call is in ``TRANSLATIONS``.

Accelerate keeps its state in process-wide singletons: one ``Accelerator`` configuration per process. When the
suite moves on to a cell with another precision, the adapter resets them as Accelerate's own tests do
(``AcceleratorState._reset_state()``, ``GradientState._reset_state()``). With torch_xla importable Accelerate
runs in its XLA mode whatever it is asked; CPU cells need ``USE_TORCH_XLA=0`` in the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Literal, TypeVar, cast

import torch
from torch.utils.data import DataLoader, IterableDataset

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
    import accelerate  # type: ignore[import-untyped]
    from accelerate import Accelerator
    from accelerate.data_loader import prepare_data_loader  # type: ignore[import-untyped]
    from accelerate.optimizer import AcceleratedOptimizer  # type: ignore[import-untyped]
    from accelerate.state import AcceleratorState, GradientState  # type: ignore[import-untyped]
    from accelerate.utils import GradScalerKwargs, is_torch_xla_available  # type: ignore[import-untyped]
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"{__name__} needs accelerate ({error}): pip install 'lightning-optimizer[peers]'", name=error.name
    ) from error

__all__ = ["NOT_CLAIMED", "TRANSLATIONS", "AccelerateContext", "conformance_info"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

TRANSLATIONS: dict[str, str] = {
    "context": "Accelerator(mixed_precision='no'|'fp16'|'bf16', cpu=device == 'cpu', gradient_accumulation_steps=N)",
    "prepare_module, wrap": "accelerator.prepare(...): the wrapper is the AcceleratedOptimizer",
    "batch": "the next batch of a prepare_data_loader(...) dataloader (Accelerate sees the end of the epoch one "
    "batch ahead; on XLA it is Accelerate's MpDeviceLoaderWrapper, which loads in a background thread), inside "
    "accelerator.accumulate(model)",
    "autocast": "accelerator.autocast(); prepare(model) also runs the model's forward under autocast and converts "
    "its outputs to float32",
    "step": "the loop body of Accelerate's docs: the closure's forward and backward, then optimizer.step(**kwargs) "
    "and optimizer.zero_grad(); accumulate() decides whether the step happens. An optimizer that evaluates the "
    "closure (LBFGS) gets it: optimizer.step(closure)",
    "make_optimizer_step=None": "accelerate's own schedule: accumulate() steps every N-th iteration and at the "
    "end of the prepared dataloader; outside a batch, each call is one accumulate() iteration",
    "make_optimizer_step=True": "the same as None: inside accumulate() Accelerate alone decides whether "
    "optimizer.step() steps",
    "make_optimizer_step=False": "the user does not call optimizer.step(): only the closure runs",
    "backward": "accelerator.backward(loss, ...): Accelerate divides the loss by N",
    "last_outcome": "STEPPED when accelerator.sync_gradients held for optimizer.step() (SKIPPED_NON_FINITE when "
    "optimizer.step_was_skipped), else ACCUMULATED",
    "unscale_gradients": "accelerator.unscale_gradients(optimizer)",
    "gradient_clip_val": "if accelerator.sync_gradients: accelerator.clip_grad_norm_ or clip_grad_value_ on the "
    "optimizer's parameters, after the backward, before optimizer.step() (the docs' recipe)",
    "toggle_model": "accelerator.no_sync(model) when sync_grad=False; Accelerate has no requires_grad toggling",
    "state_dict": "what accelerator.save_state() keeps of the Accelerator: its accumulation step and the scaler",
    "on_failure": "'discard' only, and nothing translated: a step() that raises leaves the window as the peer leaves "
    "it",
}
"""Contract call -> what the adapter writes for it (the code an Accelerate user writes in their loop)."""

NOT_CLAIMED: dict[str, str] = {
    "64-true": "Accelerate has no float64 setting (mixed_precision is 'no', 'fp16', 'bf16' or 'fp8')",
    "bf16-true": "Accelerate has no setting that keeps the model in bfloat16 ('bf16' is mixed precision)",
    "16-true": "Accelerate has no setting that keeps the model in float16: 'fp16' is mixed precision, autocast with a "
    "GradScaler over float32 weights (a model the user casts to float16 under 'fp16' is refused by that GradScaler)",
    "hooks": "Accelerate has no hooks around its optimizer's backward and step to register",
    "exact_restore": "Accelerate keeps no copy of a window to put back when a step fails, so on_failure='restore' is "
    "refused; under 'discard' a failed step leaves the gradients as Accelerate leaves them (the adapter adds nothing)",
    "user_zero_grad": "Accelerate's documented loop clears the gradients after each step (optimizer.zero_grad()), and "
    "nothing in it keeps the gradients a window carries apart from its own micro-steps, so zero_grad_after_step=False "
    "is refused (ZERO-003)",
}
"""What the adapter does not claim, and why."""

_MIXED_PRECISION = {"32-true": "no", "16-mixed": "fp16", "bf16-mixed": "bf16"}
_PRECISION = {mixed: name for name, mixed in _MIXED_PRECISION.items()}
CLOSURE_EVALUATING_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.LBFGS,)
"""Optimizers whose ``step`` needs the closure (a user passes it to ``optimizer.step`` for them alone)."""


class _LoopPositions(IterableDataset[int]):
    """The batches of the suite's loop, as a dataset: it ends after the batch that the loop marks as the last."""

    def __init__(self) -> None:
        self.current_is_last = False

    def __iter__(self) -> Iterator[int]:
        position = 0
        yield position
        while not self.current_is_last:
            position += 1
            yield position


def _accelerator(
    mixed_precision: str, cpu: bool, accumulate_grad_batches: int, grad_scaler: GradScalerSettings | None
) -> Accelerator:
    """An Accelerator; the process-wide state is reset first when it was made for another precision.

    A configured loss scaler goes in as the docs show: ``kwargs_handlers=[GradScalerKwargs(...)]``.
    """
    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed_precision:
        AcceleratorState._reset_state()
        GradientState._reset_state()
    handlers = [] if grad_scaler is None else [GradScalerKwargs(**grad_scaler.as_kwargs())]
    return Accelerator(
        mixed_precision=mixed_precision,
        cpu=cpu,
        gradient_accumulation_steps=accumulate_grad_batches,
        kwargs_handlers=handlers,
    )


class AccelerateContext(NoHooks, ZeroGradDiscard):
    """A :class:`~lightning_optimizer.spec.TrainingContext` made of an Accelerate ``Accelerator``."""

    peer_name = "Accelerate's AcceleratedOptimizer"

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
        if device == "cpu" and is_torch_xla_available():
            raise RuntimeError(
                "torch_xla is importable, so Accelerate runs in its XLA mode even with cpu=True: run the CPU cells "
                "with USE_TORCH_XLA=0 in the environment"
            )
        if device == "xla" and not is_torch_xla_available():
            raise RuntimeError(
                "Accelerate's XLA mode needs torch_xla importable and USE_TORCH_XLA unset "
                f"(USE_TORCH_XLA={os.environ.get('USE_TORCH_XLA')!r})"
            )
        self._accelerator = _accelerator(
            _MIXED_PRECISION.get(precision, precision), device == "cpu", accumulate_grad_batches, grad_scaler
        )
        self._clip_val = gradient_clip_val
        self._clip_algorithm = gradient_clip_algorithm
        self._models: list[torch.nn.Module] = []
        self._positions = _LoopPositions()
        self._loader = prepare_data_loader(
            DataLoader(self._positions, batch_size=None),
            device=self._accelerator.device,
            num_processes=1,
            process_index=0,
            put_on_device=False,
            dispatch_batches=False,
        )
        self._epoch: Iterator[Any] | None = None
        self._in_batch = False

    @property
    def precision(self) -> Precision:
        """The precision Accelerate was asked for (``accelerator.mixed_precision``, in the contract's names)."""
        mixed = self._accelerator.mixed_precision
        return cast(Precision, _PRECISION.get(mixed, mixed))

    @property
    def device(self) -> torch.device:
        """``accelerator.device``."""
        device: torch.device = self._accelerator.device
        return device

    @property
    def accumulate_grad_batches(self) -> int:
        """``accelerator.gradient_accumulation_steps``."""
        steps: int = self._accelerator.gradient_accumulation_steps
        return steps

    @property
    def on_failure(self) -> FailurePolicy:
        """``"discard"``, the only policy the adapter takes: Accelerate keeps no failed window to restore."""
        return self._on_failure

    @property
    def zero_grad_after_step(self) -> bool:
        """``True``, the only setting the adapter takes: the peer's loop clears a real step's gradients [ZERO-003]."""
        return True

    @property
    def accelerator(self) -> Accelerator:
        """The Accelerator."""
        return self._accelerator

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """``accelerator.prepare(module)``."""
        prepared: torch.nn.Module = self._accelerator.prepare(module)
        self._models.append(prepared)
        return prepared

    def wrap(self, optimizer: OptimizerT) -> PeerOptimizer[OptimizerT]:
        """``accelerator.prepare(optimizer)``, wrapped."""
        given: Any = optimizer
        if isinstance(given, PeerOptimizer):
            given = given.peer
        peer: AcceleratedOptimizer = self._accelerator.prepare(given)
        return PeerOptimizer.adapt(self, peer)

    def autocast(self) -> AbstractContextManager[None]:
        """``accelerator.autocast()``."""
        return cast(AbstractContextManager[None], self._accelerator.autocast())

    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        """The next batch of the prepared dataloader, inside ``accelerator.accumulate(model)``."""
        if self._epoch is None:
            self._epoch = iter(self._loader)
        self._positions.current_is_last = bool(is_last)
        next(self._epoch)
        self._in_batch = True
        try:
            with self._accelerator.accumulate(*self._models):
                yield
        finally:
            self._in_batch = False
            if is_last:
                # The user's `for batch in dataloader` asks once more and ends the epoch.
                next(self._epoch, None)
                self._epoch = None
                self._positions.current_is_last = False

    def state_dict(self) -> dict[str, Any]:
        """What ``accelerator.save_state()`` keeps of the Accelerator itself: its step and the scaler's state."""
        scaler = self._accelerator.scaler
        return {"step": self._accelerator.step, "scaler": None if scaler is None else scaler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore them as ``accelerator.load_state()`` does."""
        scaler = self._accelerator.scaler
        if scaler is not None and state_dict.get("scaler") is not None:
            scaler.load_state_dict(state_dict["scaler"])
        if "step" in state_dict:
            self._accelerator.step = state_dict["step"]

    # -- translations ------------------------------------------------------------------------------------

    def _iteration(self) -> AbstractContextManager[Any]:
        """Outside a batch block each call is an iteration of its own, inside ``accelerator.accumulate``."""
        return nullcontext() if self._in_batch else self._accelerator.accumulate(*self._models)

    def _peer_step(
        self,
        wrapper: PeerOptimizer[Any],
        closure: Callable[[], Any] | None,
        make_optimizer_step: object,
        kwargs: dict[str, Any],
    ) -> Any:
        peer: AcceleratedOptimizer = wrapper.peer
        with self._iteration():
            if make_optimizer_step is not None and not make_optimizer_step:
                result = None if closure is None else closure()
                wrapper.record(StepOutcome.ACCUMULATED)
                return result
            evaluates_closure = isinstance(peer.optimizer, CLOSURE_EVALUATING_OPTIMIZERS)
            result = None if closure is None or evaluates_closure else closure()
            if self._clip_val is not None and self._accelerator.sync_gradients:
                self._clip(peer)
            output = peer.step(closure, **kwargs) if evaluates_closure else peer.step(**kwargs)
            synced = self._accelerator.sync_gradients
            peer.zero_grad()
        if not synced:
            wrapper.record(StepOutcome.ACCUMULATED)
        else:
            wrapper.record(StepOutcome.SKIPPED_NON_FINITE if peer.step_was_skipped else StepOutcome.STEPPED)
        return output if evaluates_closure else result

    def _clip(self, peer: AcceleratedOptimizer) -> None:
        params = [param for group in peer.param_groups for param in group["params"]]
        if self._clip_algorithm == "value":
            self._accelerator.clip_grad_value_(params, self._clip_val)
        else:
            self._accelerator.clip_grad_norm_(params, self._clip_val)

    def _peer_backward(
        self, wrapper: PeerOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._accelerator.backward(loss, *args, **kwargs)

    def _peer_unscale_gradients(self, wrapper: PeerOptimizer[Any]) -> None:
        self._accelerator.unscale_gradients(optimizer=wrapper.peer)

    @contextmanager
    def _peer_toggle_model(self, wrapper: PeerOptimizer[Any], sync_grad: bool) -> Iterator[None]:
        with ExitStack() as stack:
            if not sync_grad:
                for model in self._models:
                    stack.enter_context(self._accelerator.no_sync(model))
            yield


def _context_for(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> AccelerateContext:
    return AccelerateContext(
        cell.precision,
        cell.device,
        accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        grad_scaler=grad_scaler if cell.precision == "16-mixed" else None,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[AccelerateContext]:
    """What Accelerate supports, and how the suite builds its contexts."""
    return ImplementationInfo(
        name="Accelerate (AcceleratedOptimizer)",
        version=accelerate.__version__,
        contract_version=CONTRACT_VERSION,
        factory=_context_for,
        devices=frozenset({"cpu", "cuda", "xla"}),
        precisions=frozenset({"32-true", "16-mixed", "bf16-mixed"}),
        world_sizes=frozenset({1, 2}),
        features=frozenset({"checkpointing", "lr_schedulers", "pickling", "closure_evaluating_optimizers"}),
    )
