"""The process group's operations, counted as ``torch.profiler`` records them: what a rank really communicated.

Every collective of ``torch.distributed`` runs as a ``c10d::`` operator (DDP's reducer, FSDP's reduce-scatters,
a ``dist.all_reduce`` of the user's or of a loss scaler), and the profiler records each one, whichever module,
hook or function issued it. So a check counts communication without knowing how an implementation syncs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch.profiler import ProfilerActivity, profile

__all__ = ["REDUCTIONS", "Reductions", "reductions"]

REDUCTIONS = ("allreduce", "reduce_scatter", "_reduce_scatter_base")
"""What the names of the reducing operators contain (``c10d::allreduce_``, ``c10d::reduce_scatter_tensor_coalesced_``,
...): a window's gradient sync, and a skip decision or a norm taken across ranks."""


@dataclass
class Reductions:
    """The reducing operators of the process group issued inside a :func:`reductions` block."""

    names: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        """How many were issued."""
        return len(self.names)


@contextmanager
def reductions() -> Iterator[Reductions]:
    """Record the reducing process-group operators issued inside the block (read them after it)."""
    found = Reductions()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield found
    found.names = [
        event.name
        for event in prof.events()
        if event.name.startswith("c10d::") and any(kind in event.name for kind in REDUCTIONS)
    ]
