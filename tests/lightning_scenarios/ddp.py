"""Two CPU ranks, started by Lightning's own ddp launcher on gloo, run two fits on ``ReferenceDDPStrategy``.

``python -m lightning_scenarios.ddp OUT_DIR``:

1. ``WindowedRegressor``, ``Trainer(accumulate_grad_batches=3)``, one epoch of 10 batches per rank (windows 3, 3,
   3, 1), with a checkpoint saved inside the second window (after batch 4);
2. the typed GAN of tests/typing/pass (``find_unused_parameters=True``: each closure's backward reaches one
   optimizer's parameters), two epochs of 10 batches;
3. ``AutomaticWindowedRegressor``, automatic optimization with its ``optimizer_step`` override, as the first fit.

Rank r trains on samples r, r + 2, r + 4, ... (``DistributedSampler`` without shuffling), so a global batch is
both ranks' shards. Each rank writes ``OUT_DIR/rank<r>.pt`` with, per fit, its final parameters, the gradient
all-reduces a DDP communication hook counted and the global step; for the first fit also each batch's step
outcome and its own accumulated gradients when the checkpoint was taken. (No ``from __future__ import
annotations`` here: DDP checks the communication hook's ``bucket`` annotation at run time.)
"""

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lightning_optimizer.reference.lightning import ReferenceDDPStrategy
from lightning_scenarios.shared import (
    BATCHES_PER_EPOCH,
    EPOCHS,
    GAN_BATCH,
    AutomaticWindowedRegressor,
    WindowedRegressor,
    gan_class,
    gan_data,
    regression_data,
)

REGRESSION_BATCH = 2
"""Samples per rank and batch in the first fit."""
ACCUMULATE = 3
SAVE_AFTER = 4


class Shards(LightningDataModule):
    """This rank's shard of ``data``, in order."""

    def __init__(self, data: TensorDataset, batch_size: int) -> None:
        super().__init__()
        self.data, self.batch_size = data, batch_size

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        trainer = self.trainer
        assert trainer is not None
        sampler: DistributedSampler[int] = DistributedSampler(
            self.data, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )
        return DataLoader(self.data, batch_size=self.batch_size, sampler=sampler)


class CountAllReduces(Callback):
    """Counts DDP's gradient all-reduces with a communication hook that then does DDP's default all-reduce."""

    def __init__(self) -> None:
        self.calls = 0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = trainer.strategy.model
        assert isinstance(model, DistributedDataParallel), type(model)
        model.register_comm_hook(self, _counting_allreduce)


def _counting_allreduce(state: CountAllReduces, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.calls += 1
    hook: Any = default_hooks.allreduce_hook  # its process-group argument may be None (the default group)
    future: torch.futures.Future[torch.Tensor] = hook(None, bucket)
    return future


class SaveInsideWindow(Callback):
    """After batch ``SAVE_AFTER`` (two micro-steps into a window) every rank joins ``save_checkpoint``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.local_grads: list[torch.Tensor | None] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == SAVE_AFTER:
            self.local_grads = [None if p.grad is None else p.grad.detach().clone() for p in pl_module.parameters()]
            trainer.save_checkpoint(self.path)


def ddp_trainer(out_dir: Path, strategy: ReferenceDDPStrategy, callbacks: list[Callback], **kwargs: Any) -> Trainer:
    return Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        precision="32-true",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        use_distributed_sampler=False,
        default_root_dir=out_dir,
        callbacks=callbacks,
        **kwargs,
    )


def params_of(model: LightningModule) -> list[torch.Tensor]:
    return [param.detach().clone() for param in model.parameters()]


def main(out_dir: Path) -> None:
    counter, saver = CountAllReduces(), SaveInsideWindow(out_dir / "mid-window.ckpt")
    regressor = WindowedRegressor()
    trainer = ddp_trainer(
        out_dir, ReferenceDDPStrategy(), [counter, saver], accumulate_grad_batches=ACCUMULATE, max_epochs=1
    )
    trainer.fit(
        regressor, datamodule=Shards(regression_data(REGRESSION_BATCH, 2 * BATCHES_PER_EPOCH), REGRESSION_BATCH)
    )
    windows = {
        "params": params_of(regressor),
        "all_reduces": counter.calls,
        "global_step": trainer.global_step,
        "outcomes": [None if outcome is None else outcome.value for outcome in regressor.outcomes],
        "grads_at_checkpoint": saver.local_grads,
    }

    gan_counter, gan = CountAllReduces(), gan_class()()
    gan_trainer = ddp_trainer(
        out_dir, ReferenceDDPStrategy(find_unused_parameters=True), [gan_counter], max_epochs=EPOCHS
    )
    gan_trainer.fit(gan, datamodule=Shards(gan_data(), GAN_BATCH))
    gan_result = {"params": params_of(gan), "all_reduces": gan_counter.calls, "global_step": gan_trainer.global_step}

    automatic_counter, automatic = CountAllReduces(), AutomaticWindowedRegressor()
    automatic_trainer = ddp_trainer(
        out_dir, ReferenceDDPStrategy(), [automatic_counter], accumulate_grad_batches=ACCUMULATE, max_epochs=1
    )
    automatic_trainer.fit(
        automatic, datamodule=Shards(regression_data(REGRESSION_BATCH, 2 * BATCHES_PER_EPOCH), REGRESSION_BATCH)
    )
    automatic_result = {
        "params": params_of(automatic),
        "all_reduces": automatic_counter.calls,
        "global_step": automatic_trainer.global_step,
        "outcomes": [None if outcome is None else outcome.value for outcome in automatic.outcomes],
    }
    results = {"windows": windows, "gan": gan_result, "automatic": automatic_result}
    torch.save(results, out_dir / f"rank{trainer.global_rank}.pt")
    # Lightning leaves the process group up after fit. Left to the interpreter's exit, gloo's worker threads can
    # still hold tensors whose release needs the GIL during finalization: an occasional SIGABRT ("terminate called
    # without an active exception", seen once on torch 2.13). torch's documented shutdown is this call.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
