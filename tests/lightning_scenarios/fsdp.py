"""Two CPU ranks, started by Lightning's own launcher on gloo, fit one sharded model on ``ReferenceFSDPStrategy``.

``python -m lightning_scenarios.fsdp OUT_DIR``: ``WindowedRegressor`` with its ``Linear`` layers sharded in
``configure_model`` (``fully_shard`` over the data-parallel mesh, as Lightning documents), manual optimization with
``Trainer(accumulate_grad_batches=3)``, one epoch of 10 batches per rank (windows 3, 3, 3, 1), and a sharded
checkpoint saved inside the second window (after batch 4). Rank r trains on samples r, r + 2, ... Each rank writes
``OUT_DIR/rank<r>.pt``: the gathered parameters, the reduce-scatters of each batch, each batch's outcome, the
global step, and how many micro-steps its own state in the checkpoint's metadata says the open window holds.
"""

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from lightning_optimizer.conformance.scenarios import CollectiveCounter
from lightning_optimizer.reference.lightning import ReferenceFSDPStrategy
from lightning_scenarios.ddp import ACCUMULATE, REGRESSION_BATCH, SAVE_AFTER, Shards
from lightning_scenarios.shared import BATCHES_PER_EPOCH, AutomaticWindowedRegressor, WindowedRegressor, regression_data


def shard_linear_layers(module: WindowedRegressor | AutomaticWindowedRegressor) -> None:
    """``fully_shard`` each ``Linear`` of ``module.net`` over the data-parallel axis of the module's device mesh."""
    mesh = module.device_mesh
    assert mesh is not None, "ModelParallelStrategy gives the module its device mesh before configure_model"
    for layer in module.net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh["data_parallel"])


class ShardedRegressor(WindowedRegressor):
    """``WindowedRegressor`` whose ``Linear`` layers ``configure_model`` shards."""

    def configure_model(self) -> None:
        shard_linear_layers(self)


class CountReduceScatters(Callback):
    """Counts FSDP2's gradient reduce-scatters per training batch (the suite's ``CollectiveCounter``)."""

    def __init__(self) -> None:
        self.per_batch: list[int] = []
        self._counter = CollectiveCounter()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._counter.__enter__()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._before = self._counter.counts["reduce_scatter"]

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.per_batch.append(self._counter.counts["reduce_scatter"] - self._before)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._counter.__exit__()


class SaveInsideWindow(Callback):
    """After batch ``SAVE_AFTER`` (two micro-steps into a window) every rank joins ``save_checkpoint``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == SAVE_AFTER:
            trainer.save_checkpoint(self.path)


def fsdp_trainer(out_dir: Path, callbacks: list[Callback], accumulate_grad_batches: int, **kwargs: Any) -> Trainer:
    """The scenarios' Trainer on ``ReferenceFSDPStrategy``: two CPU ranks, 32-true, one epoch, each rank's own shard
    of the data (no distributed sampler), quiet; ``kwargs`` add to or replace these arguments."""
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 2,
        "precision": "32-true",
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "use_distributed_sampler": False,
        "max_epochs": 1,
    }
    options.update(kwargs)
    return Trainer(
        strategy=ReferenceFSDPStrategy(),
        default_root_dir=out_dir,
        callbacks=callbacks,
        accumulate_grad_batches=accumulate_grad_batches,
        **options,
    )


def main(out_dir: Path) -> None:
    counter, checkpoint = CountReduceScatters(), out_dir / "mid-window.ckpt"
    regressor = ShardedRegressor()
    trainer = fsdp_trainer(out_dir, [counter, SaveInsideWindow(checkpoint)], ACCUMULATE)
    trainer.fit(
        regressor, datamodule=Shards(regression_data(REGRESSION_BATCH, 2 * BATCHES_PER_EPOCH), REGRESSION_BATCH)
    )
    params = [
        (param.full_tensor() if isinstance(param, DTensor) else param).detach().clone()
        for param in regressor.parameters()
    ]
    metadata = torch.load(checkpoint / "meta.pt", weights_only=False)
    contexts = metadata["ReferencePrecision"]["contexts"]
    result = {
        "params": params,
        "reduce_scatters": counter.per_batch,
        "outcomes": [None if outcome is None else outcome.value for outcome in regressor.outcomes],
        "global_step": trainer.global_step,
        "saved_pending": [context["optimizers"][0]["pending"] for context in contexts],
    }
    torch.save(result, out_dir / f"rank{trainer.global_rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
