"""What each rank of a cell with several ranks runs, DDP or FSDP (inside :mod:`lightning_optimizer.conformance.ranks`).

A scenario receives the implementation's record and the cell, trains on the rank's shard of a seeded global
batch, and returns plain data (CPU tensors, counts, outcomes) for the parent to compare with its oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_optimizer.conformance.collectives import reductions
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    Batch,
    PlannedFailure,
    adam_eps,
    build_context,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
)
from lightning_optimizer.spec import Cell, ImplementationInfo

__all__ = [
    "ACCUMULATE",
    "COLLECTIVES",
    "EPOCH",
    "LOSS_FACTOR",
    "MODULES",
    "ModuleSpec",
    "build_model",
    "build_optimizer",
    "global_batches",
    "CollectiveCounter",
    "build_sharded_optimizer",
    "load_sharded",
    "loss_backward",
    "micro_step",
    "plant_infinite_gradient",
    "plant_row",
    "rank_batches",
    "save_sharded_for_another_world_size",
    "sharded_state",
    "step_after_unsynced_backward",
    "train_epoch_on_shards",
    "train_sharded_epoch",
]

EPOCH = 7
"""Batches in the epoch: with ``ACCUMULATE`` micro-steps a window, the schedule alone closes batches 2 and 5 and
flushes batch 6 (the last)."""
ACCUMULATE = 3


@dataclass(frozen=True)
class ModuleSpec:
    """One prepared module of a scenario and its optimizer (plain SGD, with momentum when ``momentum`` > 0)."""

    seed: int
    sizes: tuple[int, ...]
    lr: float
    momentum: float


MODULES: dict[str, ModuleSpec] = {
    "a": ModuleSpec(seed=0, sizes=(4, 8, 2), lr=10.0, momentum=0.9),
    "b": ModuleSpec(seed=1, sizes=(4, 6, 2), lr=20.0, momentum=0.0),
    "c": ModuleSpec(seed=2, sizes=(4, 7, 2), lr=10.0, momentum=0.5),
}
"""The modules a scenario can prepare, by name; the learning rates make up for ``LOSS_FACTOR``."""


def build_model(name: str) -> torch.nn.Module:
    """Module ``name`` of :data:`MODULES`, seeded, on the CPU in float32."""
    spec = MODULES[name]
    return make_model(seed=spec.seed, sizes=spec.sizes)


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter]) -> torch.optim.SGD:
    """The optimizer of module ``name`` of :data:`MODULES`, on ``params``."""
    spec = MODULES[name]
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)


def rank_batches(rank: int, count: int = EPOCH) -> list[Batch]:
    """Rank ``rank``'s shard of each global batch (the global batch is every rank's shard, in rank order)."""
    return make_batches(count, seed=100 + rank)


def global_batches(world_size: int, count: int = EPOCH) -> list[Batch]:
    """Each global batch: the concatenation of every rank's shard, in rank order."""
    return [
        (torch.cat([shard[0] for shard in shards]), torch.cat([shard[1] for shard in shards]))
        for shards in zip(*(rank_batches(rank, count) for rank in range(world_size)), strict=True)
    ]


def train_epoch_on_shards(
    info: ImplementationInfo[Any],
    cell: Cell,
    *,
    form: str,
    modules: Sequence[str],
    make_optimizer_step: Sequence[Sequence[bool | None]],
    sync_at: Sequence[Sequence[int]],
    plain_backward: Sequence[bool],
) -> dict[str, Any]:
    """One epoch of ``EPOCH`` batches on this rank's shards, with one wrapper per prepared module.

    Each batch is a ``context.batch`` block in which every module, in order, takes one micro-step on the batch
    with its own wrapper: ``step(closure, make_optimizer_step=...)`` (``form="closure"``), or the forward and
    backward inside ``toggle_model(sync_grad=...)`` and then ``step(make_optimizer_step=...)``
    (``form="toggle"``), syncing only on the micro-steps in ``sync_at`` (those that close the module's window, as
    the check works them out) [TOGGLE-003]. A module's backward is ``wrapper.backward(loss)``, or
    ``loss.backward()`` where ``plain_backward`` says so. The reducing operations of the process group that each
    micro-step issues are counted (:mod:`.collectives`), whatever ``prepare_module`` made of the module.

    Returns, per batch, every module's parameters after it (``params[batch][module]``) and every wrapper's
    ``last_outcome`` after each module's call (``outcomes[batch][module]``), and per module the micro-steps that
    issued reductions, with their count (``reduces[module]``: ``(batch, count)``).
    """
    rank = dist.get_rank()
    context = build_context(info.factory, cell, accumulate_grad_batches=ACCUMULATE)
    prepared = [context.prepare_module(build_model(name)) for name in modules]
    wrappers = [
        context.wrap(build_optimizer(name, model.parameters())) for name, model in zip(modules, prepared, strict=True)
    ]
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = rank_batches(rank)
    params: list[list[list[torch.Tensor]]] = []
    outcomes: list[list[list[Any]]] = []
    reduces: list[list[tuple[int, int]]] = [[] for _ in modules]
    for batch_idx, batch in enumerate(batches):
        outcomes.append([])
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            for j, (model, wrapper) in enumerate(zip(prepared, wrappers, strict=True)):
                backward: Callable[[torch.Tensor], None] = loss_backward if plain_backward[j] else wrapper.backward

                def loss_of(model: torch.nn.Module = model, batch: Batch = batch) -> torch.Tensor:
                    with context.autocast():
                        return mse(model, batch, device, dtype) * LOSS_FACTOR

                with reductions() as issued:
                    sync = batch_idx in sync_at[j]
                    micro_step(wrapper, form, loss_of, backward, make_optimizer_step[j][batch_idx], sync)
                if issued.count:
                    reduces[j].append((batch_idx, issued.count))
                outcomes[-1].append([w.last_outcome for w in wrappers])
        params.append([[p.detach().cpu().clone() for p in model.parameters()] for model in prepared])
    return {"params": params, "outcomes": outcomes, "reduces": reduces}


def micro_step(
    wrapper: Any,
    form: str,
    loss_of: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    make_optimizer_step: bool | None,
    sync_grad: bool,
) -> None:
    """One module's micro-step in ``form``.

    ``"closure"``: ``step(closure)``; ``"toggle"``: the backward in ``toggle_model(sync_grad=...)``, then ``step()``.
    """
    if form == "closure":

        def closure() -> torch.Tensor:
            loss = loss_of()
            backward(loss)
            return loss

        wrapper.step(closure, make_optimizer_step=make_optimizer_step)
    elif form == "toggle":
        with wrapper.toggle_model(sync_grad=sync_grad):
            backward(loss_of())
        wrapper.step(make_optimizer_step=make_optimizer_step)
    else:
        raise ValueError(f"unknown call form {form!r}")


def loss_backward(loss: torch.Tensor) -> None:
    """A closure's backward without the wrapper: ``loss.backward()``."""
    loss.backward()


# -- sharded cells (FSDP2) ---------------------------------------------------------------------------------------


def build_sharded_optimizer(
    kind: str, name: str, params: Iterable[torch.nn.Parameter], cell: Cell
) -> torch.optim.Optimizer:
    """Module ``name``'s optimizer of ``kind`` on two parameter groups: the weights, and the biases at half the lr.

    ``kind`` is ``"sgd"`` (the module's SGD of :data:`MODULES`) or ``"adamw"`` (the cell's ``eps``, ``adam_eps``).
    """
    spec = MODULES[name]
    listed = list(params)
    weights, biases = listed[0::2], listed[1::2]
    groups: list[dict[str, Any]]
    if kind == "sgd":
        groups = [{"params": weights}, {"params": biases, "lr": spec.lr / 2}]
        return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum)
    if kind == "adamw":
        groups = [{"params": weights}, {"params": biases, "lr": 5e-3}]
        return torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, eps=adam_eps(cell))
    raise ValueError(f"unknown optimizer kind {kind!r}")


COLLECTIVES: dict[str, tuple[str, ...]] = {
    "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter_single"),
    "all_gather": ("all_gather_into_tensor", "all_gather_single"),
}
"""The ``torch.distributed`` functions FSDP2 reduces and gathers through, by kind: torch 2.9 calls the first name,
newer releases the second (``reduce_scatter_tensor`` is deprecated there)."""


class CollectiveCounter:
    """Counts FSDP2's collectives by kind while entered: every ``torch.distributed`` function of :data:`COLLECTIVES`.

    A call made inside another counted call (one function calling the other) is not counted again.
    """

    def __init__(self) -> None:
        self.counts = dict.fromkeys(COLLECTIVES, 0)
        self._originals: dict[str, Callable[..., Any]] = {}
        self._depth = 0

    def __enter__(self) -> CollectiveCounter:
        for kind, names in COLLECTIVES.items():
            for name in names:
                original = getattr(dist, name, None)
                if original is not None:
                    self._originals[name] = original
                    setattr(dist, name, self._counting(kind, original))
        return self

    def _counting(self, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counting(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                self.counts[kind] += 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counting

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()


def plant_row(rank: int) -> int:
    """A row of the first layer's weight (7 rows) that FSDP2's even split over 2 ranks gives to ``rank``."""
    return 4 * rank


def plant_infinite_gradient(model: torch.nn.Module, row: int) -> None:
    """Make the next backward's gradient of the first layer's ``weight[row, 0]`` infinite, and nothing else.

    A hook on the weight the first layer computes with (under FSDP the unsharded one, gathered for the forward):
    only the shard holding that row gets a non-finite gradient, so a skip decision taken from each rank's own
    shard would differ between ranks.
    """
    layer = next(module for module in model.modules() if isinstance(module, torch.nn.Linear))

    def plant(grad: torch.Tensor) -> torch.Tensor:
        handles[1].remove()
        grad = grad.clone()
        grad[row, 0] = float("inf")
        return grad

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        handles[0].remove()
        weight: torch.Tensor = module.weight  # type: ignore[assignment]
        handles.append(weight.register_hook(plant))

    handles: list[Any] = [layer.register_forward_pre_hook(before_forward)]


def _gathered(model: torch.nn.Module) -> list[torch.Tensor]:
    """The module's parameters in full (a collective: every rank calls it), on the CPU."""
    from torch.distributed.tensor import DTensor

    return [
        (param.full_tensor() if isinstance(param, DTensor) else param).detach().cpu().clone()
        for param in model.parameters()
    ]


def _sharded_run(
    info: ImplementationInfo[Any],
    cell: Cell,
    plans: Sequence[dict[str, Any]],
    *,
    clip: float | None,
    on_failure: str = "discard",
) -> tuple[Any, list[torch.nn.Module], list[Any]]:
    """A context of the cell (with the failure policy), each plan's module prepared (sharded), its optimizer wrapped."""
    from torch.distributed.fsdp import FSDPModule

    context = build_context(
        info.factory,
        cell,
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=clip,
        **failure_settings(on_failure),
    )
    prepared = [context.prepare_module(_user_sharded(build_model(plan["module"]), plan, cell)) for plan in plans]
    for plan, model in zip(plans, prepared, strict=True):
        if not isinstance(model, FSDPModule) and not plan.get("user_sharded_blocks"):
            raise AssertionError(
                f"prepare_module returned a {type(model).__name__} for module {plan['module']!r} in a cell of strategy "
                "fsdp: it must return the module sharded with fully_shard (an FSDPModule) [FSDP-001]"
            )
    wrappers = [
        context.wrap(build_sharded_optimizer(plan["optimizer"], plan["module"], model.parameters(), cell))
        for plan, model in zip(plans, prepared, strict=True)
    ]
    return context, prepared, wrappers


def _user_sharded(model: torch.nn.Module, plan: dict[str, Any], cell: Cell) -> torch.nn.Module:
    """The model as the plan's user hands it over: with ``user_sharded_blocks``, each ``Linear`` sharded (not the root).

    The cell's implementation must then keep that sharding and control each unit (FSDP-001), as under Lightning's
    ``configure_model``, where the LightningModule itself is no FSDP unit.
    """
    if not plan.get("user_sharded_blocks"):
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = cell_device(cell)
    model = model.to(device=device, dtype=cell_dtype(cell))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in list(model.modules())[1:]:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return model


def _sharded_batches(
    context: Any,
    cell: Cell,
    plans: Sequence[dict[str, Any]],
    prepared: Sequence[torch.nn.Module],
    wrappers: Sequence[Any],
    batches: Sequence[int],
    *,
    form: str,
    inf_at: Sequence[int] | None,
) -> dict[str, list[Any]]:
    rank = dist.get_rank()
    device, dtype = cell_device(cell), cell_dtype(cell)
    data = rank_batches(rank)
    record: dict[str, list[Any]] = {"params": [], "outcomes": [], "reduces": [[] for _ in plans], "failures": []}
    for batch_idx in batches:
        batch = data[batch_idx]
        record["outcomes"].append([])
        with context.batch(batch_idx, is_last=batch_idx == len(data) - 1):
            for j, (plan, model, wrapper) in enumerate(zip(plans, prepared, wrappers, strict=True)):
                planted = inf_at is not None and (batch_idx, rank) == tuple(inf_at) and j == 0
                if planted:
                    plant_infinite_gradient(model, row=plant_row(rank))

                def loss_of(model: torch.nn.Module = model, batch: Batch = batch) -> Any:
                    with context.autocast():
                        return mse(model, batch, device, dtype) * LOSS_FACTOR

                mos = plan["make_optimizer_step"][batch_idx]
                if batch_idx in plan.get("raise_at", ()):
                    record["failures"].append(
                        {"batch": batch_idx, "module": j} | _step_that_raises(wrapper, loss_of, mos)
                    )
                with CollectiveCounter() as collectives:
                    if form == "closure":

                        def closure(wrapper: Any = wrapper, loss_of: Callable[[], Any] = loss_of) -> Any:
                            loss = loss_of()
                            wrapper.backward(loss)
                            return loss

                        wrapper.step(closure, make_optimizer_step=mos)
                    else:
                        with wrapper.toggle_model(sync_grad=batch_idx in plan["sync_at"]):
                            wrapper.backward(loss_of())
                        wrapper.step(make_optimizer_step=mos)
                if collectives.counts["reduce_scatter"]:
                    record["reduces"][j].append((batch_idx, collectives.counts["reduce_scatter"]))
                record["outcomes"][-1].append([w.last_outcome for w in wrappers])
        record["params"].append([_gathered(model) for model in prepared])
    return record


def _step_that_raises(wrapper: Any, loss_of: Callable[[], Any], make_optimizer_step: bool | None) -> dict[str, Any]:
    """A ``step()`` whose closure raises after its backward; the call must raise that.

    Returns what the failed call left: the wrapper's ``last_outcome`` before and after it, whether every gradient of
    its parameters (this rank's shards) is ``None`` after it, and the exception's notes.
    """

    def closure() -> Any:
        wrapper.backward(loss_of())
        raise PlannedFailure("the closure fails after its backward, on purpose")

    before = wrapper.last_outcome
    try:
        wrapper.step(closure, make_optimizer_step=make_optimizer_step)
    except PlannedFailure as failure:
        params = [param for group in wrapper.param_groups for param in group["params"]]
        return {
            "outcomes": [before, wrapper.last_outcome],
            "grads_none": all(param.grad is None for param in params),
            "notes": [str(note) for note in getattr(failure, "__notes__", ())],
        }
    raise AssertionError("step() did not raise what its closure raised [CLOS-003]")


def train_sharded_epoch(
    info: ImplementationInfo[Any],
    cell: Cell,
    *,
    plans: Sequence[dict[str, Any]],
    form: str = "closure",
    clip: float | None = None,
    inf_at: Sequence[int] | None = None,
    checkpoint_at: int | None = None,
    on_failure: str = "discard",
) -> dict[str, Any]:
    """One epoch of ``EPOCH`` batches on this rank's shards with FSDP-sharded modules, one wrapper each.

    Each plan names a module of :data:`MODULES`, its optimizer kind (:func:`build_sharded_optimizer`), its
    ``make_optimizer_step`` per batch and, for ``form="toggle"``, the batches whose backward syncs (``sync_at``).
    A plan's ``raise_at`` names batches where a ``step()`` whose closure raises after its backward comes first
    (closure form), in a context of the failure policy ``on_failure``; the retried call must then give what the
    policy makes of it [CLOS-003, FAIL-003, FAIL-004].
    ``clip`` is the context's ``gradient_clip_val`` (by norm). ``inf_at=(batch, rank)`` makes one gradient element
    of the first module infinite on that rank, in that batch, in a row that rank's shard holds
    (:func:`plant_infinite_gradient`). With ``checkpoint_at=k``, after the epoch a second run
    trains batches ``0..k-1``, saves (the modules and optimizers through ``torch.distributed.checkpoint``, the
    context's ``state_dict()`` per rank), builds everything anew, loads, and trains batches ``k..`` again.

    Returns, per batch, every module's gathered parameters (``params[batch][module]``) and every wrapper's
    ``last_outcome`` after each module's call (``outcomes[batch][module]``), per module the calls that ran
    reduce-scatters, with their count (``reduces[module]``: ``(batch, count)``), what each failed call left
    (``failures``, see :func:`_step_that_raises`), and with ``checkpoint_at`` the resumed run's parameters
    (``resumed[batch - k][module]``).
    """
    context, prepared, wrappers = _sharded_run(info, cell, plans, clip=clip, on_failure=on_failure)
    record: dict[str, Any] = _sharded_batches(
        context, cell, plans, prepared, wrappers, range(EPOCH), form=form, inf_at=inf_at
    )
    if checkpoint_at is not None:
        record["resumed"] = _resumed(
            info, cell, plans, form=form, clip=clip, inf_at=inf_at, at=checkpoint_at, on_failure=on_failure
        )
    return record


def sharded_state(models: Sequence[torch.nn.Module], optimizers: Sequence[Any]) -> dict[str, Any]:
    """The models' and optimizers' states as ``torch.distributed.checkpoint`` saves them (``module{j}``)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {
        f"module{j}": {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        for j, (model, optimizer) in enumerate(zip(models, optimizers, strict=True))
    }


def load_sharded(models: Sequence[torch.nn.Module], optimizers: Sequence[Any], checkpoint_id: str) -> None:
    """Load a :func:`sharded_state` saved through ``torch.distributed.checkpoint`` into the models and optimizers.

    The state is resharded to the models' sharding (in one process: no sharding at all).
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state = sharded_state(models, optimizers)
    dcp_load(state, checkpoint_id=checkpoint_id)
    for j, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
        set_model_state_dict(model, state[f"module{j}"]["model"])
        set_optimizer_state_dict(model, optimizer, state[f"module{j}"]["optim"])


def _resumed(
    info: ImplementationInfo[Any],
    cell: Cell,
    plans: Sequence[dict[str, Any]],
    *,
    form: str,
    clip: float | None,
    inf_at: Sequence[int] | None,
    at: int,
    on_failure: str,
) -> list[Any]:
    import tempfile

    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    rank = dist.get_rank()
    context, prepared, wrappers = _sharded_run(info, cell, plans, clip=clip, on_failure=on_failure)
    _sharded_batches(context, cell, plans, prepared, wrappers, range(at), form=form, inf_at=inf_at)
    where: list[Any] = [tempfile.mkdtemp(prefix="fsdp-checkpoint-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    root = where[0]
    dcp_save(sharded_state(prepared, [wrapper.optimizer for wrapper in wrappers]), checkpoint_id=f"{root}/sharded")
    torch.save(context.state_dict(), f"{root}/context-rank{rank}.pt")
    dist.barrier()
    del context, prepared, wrappers
    context, prepared, wrappers = _sharded_run(info, cell, plans, clip=clip, on_failure=on_failure)
    load_sharded(prepared, [wrapper.optimizer for wrapper in wrappers], f"{root}/sharded")
    context.load_state_dict(torch.load(f"{root}/context-rank{rank}.pt", weights_only=False))
    resumed = _sharded_batches(context, cell, plans, prepared, wrappers, range(at, EPOCH), form=form, inf_at=inf_at)
    dist.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    params: list[Any] = resumed["params"]
    return params


def step_after_unsynced_backward(info: ImplementationInfo[Any], cell: Cell, *, module: str) -> dict[str, Any]:
    """A window of ``ACCUMULATE`` micro-steps whose closing backward runs inside ``toggle_model(sync_grad=False)``.

    Returns the closing ``step()``'s exception type name (``None`` if it returned), the gathered parameters before
    and after it, and the wrapper's ``last_outcome`` before and after it.
    """
    context, prepared, wrappers = _sharded_run(info, cell, [{"module": module, "optimizer": "sgd"}], clip=None)
    model, wrapper = prepared[0], wrappers[0]
    device, dtype = cell_device(cell), cell_dtype(cell)
    data = rank_batches(dist.get_rank())
    refused: str | None = None
    before: list[torch.Tensor] = []
    outcome_before = None
    for batch_idx in range(ACCUMULATE):
        closing = batch_idx == ACCUMULATE - 1
        with context.batch(batch_idx):
            with wrapper.toggle_model(sync_grad=False):
                with context.autocast():
                    loss = mse(model, data[batch_idx], device, dtype) * LOSS_FACTOR
                wrapper.backward(loss)
            if closing:
                before, outcome_before = _gathered(model), wrapper.last_outcome
                try:
                    wrapper.step()
                except Exception as error:  # the check reports whatever it was
                    refused = type(error).__name__
            else:
                wrapper.step()
    return {
        "refused": refused,
        "before": before,
        "after": _gathered(model),
        "outcomes": [outcome_before, wrapper.last_outcome],
    }


def save_sharded_for_another_world_size(info: ImplementationInfo[Any], cell: Cell, *, root: str) -> None:
    """Train module ``c`` with AdamW for two windows of ``ACCUMULATE`` micro-steps, then save for one process.

    Saves under ``root``: the model and optimizer through ``torch.distributed.checkpoint`` (``sharded``, a
    :func:`sharded_state` for :func:`load_sharded`) and each rank's context state with no window open
    (``closed-rank{r}.pt``); after one micro-step more, the context state with that window open
    (``open-rank{r}.pt``).
    """
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    rank = dist.get_rank()
    context, prepared, wrappers = _sharded_run(info, cell, [{"module": "c", "optimizer": "adamw"}], clip=None)
    model, wrapper = prepared[0], wrappers[0]
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = rank_batches(rank, 2 * ACCUMULATE + 1)

    def train(batch_idx: int) -> None:
        def closure() -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batches[batch_idx], device, dtype) * LOSS_FACTOR
            wrapper.backward(loss)
            return loss

        with context.batch(batch_idx):
            wrapper.step(closure)

    for batch_idx in range(2 * ACCUMULATE):
        train(batch_idx)
    dcp_save(sharded_state([model], [wrapper.optimizer]), checkpoint_id=f"{root}/sharded")
    torch.save(context.state_dict(), f"{root}/closed-rank{rank}.pt")
    train(2 * ACCUMULATE)
    torch.save(context.state_dict(), f"{root}/open-rank{rank}.pt")
    dist.barrier()
