"""A generated schedule run on one rank of a DDP or FSDP cell, on the rank's shard of every batch.

Each rank builds the schedule's model, prepares each head as a module of its own (a head's loss reads every head's
output, and only toggling keeps the other heads' parameters out of its backward pass), wraps one optimizer per head
and runs the schedule's calls (:func:`.schedule_runner.run_schedule`). The collectives each call issues are counted
on the process group's own operations (:mod:`.collectives`), not by the module's class. The parent compares the
ranks' runs with :class:`~.schedule_oracle.ScheduleOracle` on the global batch.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from lightning_optimizer.conformance.harness import build_context
from lightning_optimizer.conformance.schedule_oracle import Schedule
from lightning_optimizer.conformance.schedule_runner import Planned, Run, run_schedule
from lightning_optimizer.spec import Cell, ImplementationInfo, TrainingContext

__all__ = ["run_on_rank"]


def run_on_rank(info: ImplementationInfo[Any], cell: Cell, *, schedule: Schedule, plan: list[list[Planned]]) -> Run:
    """Run ``schedule`` on this rank's shards; ``plan[i][j]``: what the oracle knows of iteration ``i``'s call ``j``.

    Returns this rank's :class:`~.schedule_runner.Run` (its own gradients, the parameters and states in full).
    """

    def make_context(**settings: Any) -> TrainingContext:
        context: TrainingContext = build_context(info.factory, cell, **settings)
        return context

    return run_schedule(make_context, schedule, cell, plan, rank=(dist.get_rank(), dist.get_world_size()))
