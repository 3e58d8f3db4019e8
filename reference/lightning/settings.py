"""What the reference takes from a Trainer's arguments for one run, checked before anything changes."""

from __future__ import annotations

from dataclasses import dataclass

from lightning.pytorch import Trainer
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference.clipping import ClipAlgorithm
from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.lightning import compat
from lightning_optimizer.spec.implementation import GradScalerSettings
from lightning_optimizer.spec.types import PRECISIONS
from lightning_optimizer.spec.types import Precision as PrecisionName

__all__ = ["RunSettings", "reference_precision"]


def reference_precision(flag: object) -> PrecisionName:
    """``Trainer(precision=...)`` as Lightning keeps it, checked: one of the precisions the reference runs."""
    if not isinstance(flag, str):
        raise RuntimeError(
            "cannot read Trainer(precision=...) from this Lightning version; the reference strategies are made "
            "for Lightning 2.5 and 2.6"
        )
    for name in PRECISIONS:
        if flag == name:
            return name
    raise ValueError(
        f"Trainer(precision={flag!r}) is not a precision the reference runs; use one of {', '.join(PRECISIONS)}"
    )


@dataclass(frozen=True)
class RunSettings:
    """What the reference takes over from the Trainer's arguments for one run."""

    precision: PrecisionName
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: ClipAlgorithm
    grad_scaler: GradScalerSettings | None = None
    zero_grad_after_step: bool = True
    """``False`` under automatic optimization, where Lightning's loop calls ``optimizer_zero_grad`` (ZERO-003)."""

    @classmethod
    def read(
        cls,
        trainer: Trainer,
        grad_scaler: GradScalerSettings | None,
        gradient_clip_val: float | None,
        *,
        zero_grad_after_step: bool = True,
    ) -> RunSettings:
        """The Trainer's settings, ``gradient_clip_val`` being the clipping the reference applies, checked now."""
        algorithm = trainer.gradient_clip_algorithm
        precision = reference_precision(compat.requested_precision(trainer))
        if grad_scaler is not None and precision != "16-mixed":
            raise ValueError(
                f"the strategy's grad_scaler settings apply to Trainer(precision='16-mixed'), the one precision that "
                f"scales the loss; this Trainer runs {precision!r}: drop grad_scaler or use 16-mixed"
            )
        clip_val = None if gradient_clip_val is None or gradient_clip_val == 0 else float(gradient_clip_val)
        by_value = clip_val is not None and algorithm is not None and algorithm.value == "value"
        settings = cls(
            precision=precision,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            gradient_clip_val=clip_val,
            # The Trainer takes an algorithm without a value and clips nothing: so does the context, as "norm".
            gradient_clip_algorithm="value" if by_value else "norm",
            grad_scaler=grad_scaler,
            zero_grad_after_step=zero_grad_after_step,
        )
        settings.context("cpu")  # the reference validates every setting now, before anything changes
        return settings

    def context(self, device: str, *, sharded: bool = False) -> TrainingContext:
        """A training context with these settings on ``device`` (FSDP2 when ``sharded``, else one process or DDP)."""
        scaler = None if self.grad_scaler is None else GradScaler(device, **self.grad_scaler.as_kwargs())
        return TrainingContext(
            self.precision,
            device,  # type: ignore[arg-type]  # the context names an unknown device in its error
            self.accumulate_grad_batches,
            gradient_clip_val=self.gradient_clip_val,
            gradient_clip_algorithm=self.gradient_clip_algorithm,
            scaler=scaler,
            strategy="fsdp" if sharded else "ddp",
            zero_grad_after_step=self.zero_grad_after_step,
        )
