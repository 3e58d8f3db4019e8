"""Two CPU ranks on gloo, started by Lightning's own launcher: the forms tests/test_lightning_distributed.py checks.

``python -m lightning_scenarios.distributed CASES OUT_DIR``, CASES a comma-separated list of :data:`CASES`, run one
after another by the same two ranks (one launch: each rank imports torch and Lightning once):

- ``ddp-backward-then-step``: :class:`ManualRegressor` on ``ReferenceDDPStrategy``, each micro-step
  ``self.manual_backward(loss)`` inside ``opt.toggle_model(sync_grad=closes)``, then
  ``opt.step(make_optimizer_step=closes)``;
- ``ddp-closure``: the same module and cadence, ``self.manual_backward(loss)`` inside the closure of
  ``opt.step(closure, make_optimizer_step=closes)``;
- ``fsdp-automatic``: :class:`ShardedAutomaticRegressor` (automatic optimization, its ``Linear`` layers sharded in
  ``configure_model``) on ``ReferenceFSDPStrategy`` with ``Trainer(accumulate_grad_batches=2)``;
- ``fsdp-resume-automatic``: that module and Trainer three times: a run that a ``ModelCheckpoint`` saves at the
  end of its second window and ``max_steps`` stops there, an uninterrupted run, and a new Trainer resuming the first
  run's checkpoint with ``fit(ckpt_path=...)``;
- ``fsdp-resume-manual``: the same three runs of the FSDP scenario's ``ShardedRegressor`` (manual optimization,
  the Trainer's ``accumulate_grad_batches`` closing its windows).

Rank r trains on samples r, r + 2, r + 4, ... in batches of :data:`PER_RANK_BATCH` (``DistributedSampler`` without
shuffling), so a global batch is both ranks' shards. Each rank writes ``OUT_DIR/<case>/rank<r>.pt``, one dict per run:
the final parameters (FSDP: gathered full tensors), the gradient collectives of each training batch (DDP: the
all-reduces a communication hook counted; FSDP: the reduce-scatters), each ``step()``'s outcome and the global step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.tensor import DTensor
from torch.utils.data import DistributedSampler, TensorDataset

from lightning_optimizer.conformance.harness import make_model
from lightning_optimizer.reference.lightning import ReferenceDDPStrategy, wrapped_optimizers
from lightning_optimizer.spec import StepOutcome
from lightning_scenarios.ddp import CountAllReduces, Shards, ddp_trainer
from lightning_scenarios.fsdp import CountReduceScatters, ShardedRegressor, fsdp_trainer, shard_linear_layers
from lightning_scenarios.shared import AutomaticWindowedRegressor, Batch, ResumableBatches, regression_data

CASES = ("ddp-backward-then-step", "ddp-closure", "fsdp-automatic", "fsdp-resume-automatic", "fsdp-resume-manual")
PER_RANK_BATCH = 2
"""Samples per rank and batch."""
DDP_BATCHES = 5
"""Batches per rank in the DDP runs: with a window closed every :data:`EVERY` batches, windows 2, 2 and the last 1."""
FSDP_BATCHES = 9
"""Batches per rank in the FSDP runs: ``accumulate_grad_batches=2`` makes windows 2, 2, 2, 2 and the last 1."""
EVERY = 2
"""The manual module's ``make_optimizer_step`` cadence; the FSDP Trainer's ``accumulate_grad_batches``."""
RESUME_AT_STEP = 2
"""The global step at which the cut run saves and stops: after batch 3, the end of its second window."""
CHECKPOINT = "boundary"
"""The cut run's checkpoint, ``OUT_DIR/checkpoints/boundary.ckpt`` (a directory: FSDP's sharded checkpoint)."""


def closes_window(batch_idx: int, batches: int) -> bool:
    """Whether batch ``batch_idx`` closes its window: every :data:`EVERY`-th batch, and the epoch's last."""
    return (batch_idx + 1) % EVERY == 0 or batch_idx == batches - 1


class ManualRegressor(LightningModule):
    """Manual optimization, one SGD optimizer, ``make_optimizer_step`` by :func:`closes_window`.

    ``form`` is ``"backward-then-step"`` (``self.manual_backward`` in a ``toggle_model`` block whose ``sync_grad``
    is whether the micro-step closes its window, as the reference's README says for DDP, then ``opt.step()``) or
    ``"closure"`` (``self.manual_backward`` in the closure of ``opt.step(closure)``).
    """

    def __init__(self, form: str) -> None:
        super().__init__()
        if form not in ("backward-then-step", "closure"):
            raise ValueError(f"unknown form {form!r}")
        self.automatic_optimization = False
        self.form = form
        self.net = make_model(seed=0)
        self.outcomes: list[StepOutcome | None] = []

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        opt = wrapped_optimizers(self, torch.optim.SGD)
        x, y = batch
        closes = closes_window(batch_idx, int(self.trainer.num_training_batches))

        def closure() -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.manual_backward(loss)
            return loss

        if self.form == "closure":
            loss = opt.step(closure, make_optimizer_step=closes)
        else:
            with opt.toggle_model(sync_grad=closes):
                loss = closure()
            opt.step(make_optimizer_step=closes)
        self.outcomes.append(opt.last_outcome)
        return loss.detach()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)


class ShardedAutomaticRegressor(AutomaticWindowedRegressor):
    """``AutomaticWindowedRegressor`` whose ``Linear`` layers ``configure_model`` shards over the data-parallel mesh."""

    def configure_model(self) -> None:
        shard_linear_layers(self)


class AllReducesPerBatch(CountAllReduces):
    """DDP's gradient all-reduces (its communication hook's calls) in each training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.per_batch: list[int] = []
        self._before = 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._before = self.calls

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.per_batch.append(self.calls - self._before)


class ResumableShards(LightningDataModule):
    """This rank's shard of ``data`` in batches, as a :class:`ResumableBatches` (a checkpoint keeps its position)."""

    def __init__(self, data: TensorDataset, batch_size: int) -> None:
        super().__init__()
        self.data, self.batch_size = data, batch_size

    def train_dataloader(self) -> ResumableBatches:
        trainer = self.trainer
        assert trainer is not None
        sampler: DistributedSampler[int] = DistributedSampler(
            self.data, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False
        )
        indices = list(sampler)
        x, y = self.data.tensors
        chunks = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        return ResumableBatches([(x[chunk], y[chunk]) for chunk in chunks])


def params_of(model: LightningModule) -> list[torch.Tensor]:
    """The model's parameters, FSDP's shards gathered into full tensors."""
    return [
        (param.full_tensor() if isinstance(param, DTensor) else param).detach().clone() for param in model.parameters()
    ]


def outcome_values(outcomes: list[StepOutcome | None]) -> list[str | None]:
    return [None if outcome is None else outcome.value for outcome in outcomes]


def run_ddp(out_dir: Path, form: str) -> tuple[int, dict[str, Any]]:
    counter, model = AllReducesPerBatch(), ManualRegressor(form)
    trainer = ddp_trainer(out_dir, ReferenceDDPStrategy(), [counter], max_epochs=1)
    trainer.fit(model, datamodule=Shards(regression_data(PER_RANK_BATCH, 2 * DDP_BATCHES), PER_RANK_BATCH))
    return trainer.global_rank, {
        "params": params_of(model),
        "all_reduces": counter.per_batch,
        "outcomes": outcome_values(model.outcomes),
        "global_step": trainer.global_step,
    }


def fsdp_fit(
    out_dir: Path,
    mode: str = "automatic",
    *,
    callbacks: list[Callback] | None = None,
    ckpt_path: Path | None = None,
    **kwargs: Any,
) -> tuple[Trainer, dict[str, Any]]:
    """One fit on ``ReferenceFSDPStrategy``, windows of :data:`EVERY`: :class:`ShardedAutomaticRegressor`, or in
    ``"manual"`` mode the FSDP scenario's ``ShardedRegressor``."""
    model: ShardedAutomaticRegressor | ShardedRegressor
    model = ShardedRegressor() if mode == "manual" else ShardedAutomaticRegressor()
    counter = CountReduceScatters()
    trainer = fsdp_trainer(out_dir, [counter, *(callbacks or [])], EVERY, **kwargs)
    data = ResumableShards(regression_data(PER_RANK_BATCH, 2 * FSDP_BATCHES), PER_RANK_BATCH)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer, {
        "params": params_of(model),
        "reduce_scatters": counter.per_batch,
        "outcomes": outcome_values(model.outcomes),
        "global_step": trainer.global_step,
    }


def run_fsdp_resume(out_dir: Path, mode: str) -> tuple[int, dict[str, Any]]:
    checkpoints = out_dir / "checkpoints"
    saver = ModelCheckpoint(dirpath=checkpoints, filename=CHECKPOINT, every_n_train_steps=RESUME_AT_STEP, save_top_k=-1)
    trainer, cut = fsdp_fit(out_dir, mode, callbacks=[saver], enable_checkpointing=True, max_steps=RESUME_AT_STEP)
    checkpoint = checkpoints / f"{CHECKPOINT}.ckpt"
    metadata = torch.load(checkpoint / "meta.pt", weights_only=False)
    cut["checkpoint"] = {
        "global_step": metadata["global_step"],
        "pending": [context["optimizers"][0]["pending"] for context in metadata["ReferencePrecision"]["contexts"]],
    }
    _, full = fsdp_fit(out_dir, mode)
    _, resumed = fsdp_fit(out_dir, mode, ckpt_path=checkpoint)
    return trainer.global_rank, {"cut": cut, "full": full, "resumed": resumed}


def main(cases: list[str], out_dir: Path) -> None:
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}: each one of {', '.join(CASES)}")
    for case in cases:
        folder = out_dir / case
        folder.mkdir(parents=True, exist_ok=True)
        if case in ("ddp-backward-then-step", "ddp-closure"):
            rank, result = run_ddp(folder, case.removeprefix("ddp-"))
        elif case == "fsdp-automatic":
            trainer, result = fsdp_fit(folder)
            rank = trainer.global_rank
        else:
            rank, result = run_fsdp_resume(folder, case.removeprefix("fsdp-resume-"))
        torch.save(result, folder / f"rank{rank}.pt")
    # As the other scenarios: torch's documented shutdown, not the interpreter's exit with gloo threads running.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1].split(","), Path(sys.argv[2]))
