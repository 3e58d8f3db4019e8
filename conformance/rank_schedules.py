"""A generated schedule run on one rank of a DDP or FSDP cell, on the rank's shard of every batch.

Each rank builds the schedule's model, prepares each head as a module of its own (a head's loss reads every head's
output, and only toggling keeps the other heads' parameters out of its backward pass), wraps one optimizer per head
and runs the schedule's calls. The collectives each call issues are counted on the process group's own operations
(:mod:`.collectives`), not by the module's class.

It returns plain data for the parent, which runs :class:`~.schedule_oracle.ScheduleOracle` on the global batch:
per call the outcomes, the reductions and this rank's gradients (the open windows' local sums, whose mean over the
ranks is the global batch's); per iteration the parameters (gathered in full) and the loss scales; at the end the
inner optimizers' state (gathered in full) and the loss scaler's state.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from lightning_optimizer.conformance.assertions import grad_scaler_states
from lightning_optimizer.conformance.collectives import reductions
from lightning_optimizer.conformance.harness import Batch, build_context
from lightning_optimizer.conformance.schedule_oracle import (
    Call,
    Schedule,
    ScheduleHead,
    ScheduleModel,
    make_optimizer,
    schedule_batches,
    schedule_loss,
)
from lightning_optimizer.spec import Cell, ImplementationInfo, OptimizerWrapper, TrainingContext

__all__ = ["full", "rank_shard", "run_schedule"]


def rank_shard(batch: Batch, rank: int, world_size: int) -> Batch:
    """Rank ``rank``'s equal part of ``batch``: the mean of the ranks' losses is the global batch's loss."""
    x, y = batch
    return x.chunk(world_size)[rank], y.chunk(world_size)[rank]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` whole, on the CPU: a ``DTensor`` gathered from its shards (a collective every rank calls)."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu().clone()


def _local_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The gradient of ``param`` on this rank, on the CPU: a shard's own part under FSDP."""
    from torch.distributed.tensor import DTensor

    grad = param.grad
    if grad is None:
        return None
    return (grad.to_local() if isinstance(grad, DTensor) else grad).detach().cpu().clone()


class _RankSubject:
    """The implementation under test on this rank: the context, the model with its prepared heads, the wrappers."""

    def __init__(self, info: ImplementationInfo[Any], cell: Cell, schedule: Schedule) -> None:
        settings: dict[str, Any] = {"accumulate_grad_batches": schedule.accumulate_grad_batches}
        if schedule.clipping is not None:
            settings.update(gradient_clip_algorithm=schedule.clipping[0], gradient_clip_val=schedule.clipping[1])
        if schedule.grad_scaler is not None and cell.precision == "16-mixed":
            settings.update(grad_scaler=schedule.grad_scaler)
        self.cell = cell
        self.context: TrainingContext = build_context(info.factory, cell, **settings)
        self.model = ScheduleModel(schedule.heads)
        heads = [self.model.head(i) for i in range(len(schedule.heads))]
        for i, head in enumerate(heads):
            self.model.heads[i] = self.context.prepare_module(head)
        # prepare_module moves the head (DDP keeps it as .module, fully_shard shards it in place): its parameters
        # are now the ones to optimize.
        self.wrappers: list[OptimizerWrapper[Any]] = [
            self.context.wrap(make_optimizer(spec, head.groups(spec)))
            for spec, head in zip(schedule.heads, heads, strict=True)
        ]
        self.heads: list[ScheduleHead] = heads
        self.scales: list[float] = []

    def call(self, call: Call, batch: Batch, closes: bool) -> None:
        """One call of the schedule; ``closes``: whether it closes its window (the ``sync_grad`` of a block)."""
        wrapper = self.wrappers[call.optimizer]
        if call.zero_grad_first:
            wrapper.zero_grad(set_to_none=call.set_to_none)

        def forward_backward() -> torch.Tensor:
            with self.context.autocast():
                loss = schedule_loss(self.model, call.optimizer, batch, self.cell, non_finite=call.non_finite)
            loss.register_hook(lambda grad: self.scales.append(float(grad)))
            if call.form == "closure_plain_backward":
                loss.backward()
            else:
                wrapper.backward(loss)
            return loss

        if call.form == "toggle_model":
            with wrapper.toggle_model(sync_grad=closes):
                forward_backward()
            wrapper.step(make_optimizer_step=call.make_optimizer_step)
        else:
            wrapper.step(forward_backward, make_optimizer_step=call.make_optimizer_step)

    def params(self) -> list[torch.Tensor]:
        """Every parameter of the model in full, on the CPU (gathered: every rank calls it)."""
        return [full(param) for head in self.heads for param in head.parameters()]

    def grads(self) -> list[torch.Tensor | None]:
        """The gradient of every parameter of the model on this rank."""
        return [_local_grad(param) for head in self.heads for param in head.parameters()]

    def optimizer_states(self) -> list[dict[str, Any]]:
        """Each inner optimizer's ``state_dict()`` with its tensors in full, on the CPU."""
        states = []
        for wrapper in self.wrappers:
            state = wrapper.optimizer.state_dict()
            entries = {
                param: {key: full(value) if isinstance(value, torch.Tensor) else value for key, value in entry.items()}
                for param, entry in state["state"].items()
            }
            states.append({"state": entries, "param_groups": state["param_groups"]})
        return states


def run_schedule(
    info: ImplementationInfo[Any], cell: Cell, *, schedule: Schedule, closes: list[list[bool]]
) -> dict[str, Any]:
    """Run ``schedule`` on this rank's shards; ``closes[i][j]``: whether iteration ``i``'s call ``j`` closes a window.

    Returns ``calls[i][j]`` (every wrapper's ``last_outcome``, the reductions, this rank's gradients, after
    iteration ``i``'s call ``j``), ``params[i]`` (after iteration ``i``), ``scales``, ``optimizers`` (final
    states) and ``scalers`` (the loss scaler states found in the context's state).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    subject = _RankSubject(info, cell, schedule)
    batches = [rank_shard(batch, rank, world_size) for batch in schedule_batches(schedule)]
    calls: list[list[dict[str, Any]]] = []
    params: list[list[torch.Tensor]] = []
    for position, closing in zip(schedule.iterations(), closes, strict=True):
        block: AbstractContextManager[Any] = nullcontext()
        if position.batch_idx is not None:
            block = subject.context.batch(position.batch_idx, is_last=position.is_last)
        calls.append([])
        with block:
            for call, closes_window in zip(position.calls, closing, strict=True):
                with reductions() as issued:
                    subject.call(call, batches[position.index], closes_window)
                calls[-1].append(
                    {
                        "outcomes": [wrapper.last_outcome for wrapper in subject.wrappers],
                        "reductions": issued.count,
                        "grads": subject.grads(),
                    }
                )
        params.append(subject.params())
    return {
        "calls": calls,
        "params": params,
        "scales": subject.scales,
        "optimizers": subject.optimizer_states(),
        "scalers": grad_scaler_states(subject.context.state_dict()),
    }
