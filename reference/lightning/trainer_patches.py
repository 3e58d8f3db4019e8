"""What the reference changes on a Trainer during one run, each change saved when made and given back at teardown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Trainer

from lightning_optimizer.reference.lightning import compat

__all__ = ["TrainerPatches"]


class TrainerPatches:
    """Everything the reference changes on one Trainer during a run, each saved when made; :meth:`restore` undoes it.

    The Trainer's ``accumulate_grad_batches``, ``gradient_clip_val`` and ``gradient_clip_algorithm`` get their
    values from before the run back, the epoch loop its own accumulation rule, the automatic loop its own way to run
    a batch. The Trainer's callbacks are never changed.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._arguments = (trainer.accumulate_grad_batches, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        self._decides_accumulation = False
        self._routes_automatic_batches = False

    def take_accumulation_and_clipping(self) -> None:
        """Hide ``accumulate_grad_batches`` and ``gradient_clip_val`` from Lightning's checks.

        Lightning refuses both for manual optimization; the reference applies them.
        """
        self.trainer.accumulate_grad_batches = 1
        self.trainer.gradient_clip_val = None

    def give_accumulation_back(self) -> None:
        """Give the Trainer its accumulation back, once Lightning has checked its arguments.

        Lightning's loop and ``trainer.estimated_stepping_batches`` read it.
        """
        self.trainer.accumulate_grad_batches = self._arguments[0]

    def decide_accumulation(self, answer: Callable[[Callable[[], bool]], bool]) -> None:
        """Let ``answer`` tell the epoch loop whether a batch only accumulated (see :mod:`.compat`)."""
        compat.decide_accumulation(self.trainer, answer)
        self._decides_accumulation = True

    def route_automatic_batches(
        self,
        micro_step: Callable[[Callable[[], Any]], object],
        batch_done: Callable[[], None],
        closure_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer],
    ) -> None:
        """Route automatic optimization's batches (see :mod:`.compat`)."""
        compat.route_automatic_batches(self.trainer, micro_step, batch_done, closure_optimizer)
        self._routes_automatic_batches = True

    def restore(self) -> None:
        """Give the Trainer back every setting and rule as they were before the run."""
        trainer = self.trainer
        if self._decides_accumulation:
            compat.forget_accumulation_decision(trainer)
            self._decides_accumulation = False
        if self._routes_automatic_batches:
            compat.forget_automatic_batches(trainer)
            self._routes_automatic_batches = False
        trainer.accumulate_grad_batches, trainer.gradient_clip_val, trainer.gradient_clip_algorithm = self._arguments
