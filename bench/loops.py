"""One implementation's training loop on one case, each written the way its documentation tells users to.

Every loop trains the case's model (same initial weights) with the case's optimizer on one fixed batch. A
*micro-step* is a forward and a backward; a *step* is a window of ``case.accumulate`` micro-steps and the
optimizer step that closes it (without accumulation: zero_grad, forward, backward, step). Every loop computes
the same update: the window's gradient is the mean of its micro-steps' gradients, as the reference's is with
``accumulate_grad_batches``. :meth:`Loop.time` runs untimed warm-up steps, then reports the wall time of each
timed step in nanoseconds. On CUDA each step ends with ``torch.cuda.synchronize()`` inside the timed region.
Each loop runs alone in its process (:mod:`bench.worker`).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.cases import IMPLEMENTATIONS, Case, mse

MicroStep = Callable[[int, bool], None]
"""One micro-step: ``(batch_idx, is_last)``, where ``is_last`` marks the run's last batch (its epoch's end)."""


class Unavailable(Exception):
    """An implementation that cannot run here; the message says why."""


class Loop(ABC):
    """An implementation's training loop on one case."""

    impl: str
    note: str

    @abstractmethod
    def time(self, warmup: int, steps: int) -> list[int]:
        """Run ``warmup`` untimed then ``steps`` timed optimizer steps; return each timed one's wall time (ns)."""


class StepLoop(Loop):
    """A loop whose micro-step is a plain function of the batch index; a step is timed as a whole."""

    def __init__(
        self, impl: str, note: str, micro_step: MicroStep, case: Case, device: torch.device, model: torch.nn.Module
    ) -> None:
        self.impl, self.note, self.model = impl, note, model
        self._micro_step, self._accumulate = micro_step, case.accumulate
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def time(self, warmup: int, steps: int) -> list[int]:
        micro_step, accumulate, sync, clock = self._micro_step, self._accumulate, self._sync, time.perf_counter_ns
        last = (warmup + steps) * accumulate - 1
        batch_idx = 0
        for _ in range(warmup * accumulate):
            micro_step(batch_idx, batch_idx == last)
            batch_idx += 1
        if sync is not None:
            sync()
        samples = []
        for _ in range(steps):
            start = clock()
            for _ in range(accumulate):
                micro_step(batch_idx, batch_idx == last)
                batch_idx += 1
            if sync is not None:
                sync()
            samples.append(clock() - start)
        return samples


def build_loop(impl: str, case: Case, device: torch.device) -> Loop:
    """The loop of ``impl`` on ``case``; :class:`Unavailable` when its framework is missing or refuses."""
    builders: dict[str, Callable[[Case, torch.device], Loop]] = {
        "raw": _raw,
        "reference": _reference_closure,
        "reference-direct": _reference_direct,
        "reference-restore": lambda case, device: _reference_closure(case, device, "restore"),
        "reference-direct-restore": lambda case, device: _reference_direct(case, device, "restore"),
        "reference-user-zero": lambda case, device: _reference_user_zero(case, device, every=1),
        "reference-carry": lambda case, device: _reference_user_zero(case, device, every=2),
        "lightning": _lightning,
        "fabric": _fabric,
        "accelerate": _accelerate,
    }
    if impl not in builders:
        raise ValueError(f"unknown implementation {impl!r}; expected one of {', '.join(IMPLEMENTATIONS)}")
    return builders[impl](case, device)


def quiet_frameworks() -> None:
    """Silence the peers' start-up banners and tips (call again after importing one: it resets its logger)."""
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    # With torch_xla installed, Accelerate would pick the XLA device even for Accelerator(cpu=True).
    os.environ["USE_TORCH_XLA"] = "0"


def _closes(case: Case, batch_idx: int, is_last: bool) -> bool:
    """Whether micro-step ``batch_idx`` closes its window (the schedule of ``accumulate_grad_batches``)."""
    return (batch_idx + 1) % case.accumulate == 0 or is_last


# -- raw PyTorch -----------------------------------------------------------------------------------------


def _raw(case: Case, device: torch.device) -> Loop:
    model = case.model.build().to(device)
    optimizer = case.build_optimizer(model.parameters())
    inputs, targets = case.model.data(device)
    k = case.accumulate
    if case.precision == "32-true" and k == 1:

        def iteration(batch_idx: int, is_last: bool) -> None:
            optimizer.zero_grad()
            loss = mse(model(inputs), targets)
            loss.backward()
            optimizer.step()

        return StepLoop("raw", "zero_grad, forward, backward, step", iteration, case, device, model)

    if case.precision == "32-true":
        # The usual accumulation loop: `loss / k` makes the summed gradients the window's mean, which is what
        # the reference applies with accumulate_grad_batches=k; step and zero_grad on the window's last batch.
        def accumulating(batch_idx: int, is_last: bool) -> None:
            loss = mse(model(inputs), targets) / k
            loss.backward()
            if _closes(case, batch_idx, is_last):
                optimizer.step()
                optimizer.zero_grad()

        return StepLoop("raw", f"loss / {k}, backward; step, zero_grad every {k}th", accumulating, case, device, model)

    # The loops of PyTorch's AMP examples: autocast forward, scaled backward, scaler.step, scaler.update; with
    # accumulation ("Gradient accumulation" there) the loss divided by k under autocast, one step and one
    # update of the scale per window.
    scaler = torch.amp.grad_scaler.GradScaler(device.type)
    if k == 1:

        def amp_iteration(batch_idx: int, is_last: bool) -> None:
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16):
                loss = mse(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        return StepLoop("raw", "hand-written GradScaler loop", amp_iteration, case, device, model)

    def amp_accumulating(batch_idx: int, is_last: bool) -> None:
        with torch.autocast(device.type, dtype=torch.float16):
            loss = mse(model(inputs), targets) / k
        scaler.scale(loss).backward()
        if _closes(case, batch_idx, is_last):
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()

    note = f"hand-written GradScaler loop, loss / {k}; step, update, zero_grad every {k}th"
    return StepLoop("raw", note, amp_accumulating, case, device, model)


# -- the reference ---------------------------------------------------------------------------------------


def _reference_parts(
    case: Case, device: torch.device, on_failure: str, *, zero_grad_after_step: bool = True
) -> tuple[Any, torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
    from lightning_optimizer.reference import TrainingContext

    context = TrainingContext(
        case.precision,
        "cuda" if device.type == "cuda" else "cpu",
        accumulate_grad_batches=case.accumulate,
        on_failure=on_failure,  # type: ignore[arg-type]
        zero_grad_after_step=zero_grad_after_step,
    )
    model = context.prepare_module(case.model.build())
    optimizer = context.wrap(case.build_optimizer(model.parameters()))
    inputs, targets = case.model.data(context.device)
    return context, model, optimizer, inputs, targets


def _reference_closure(case: Case, device: torch.device, on_failure: str = "discard") -> Loop:
    context, model, optimizer, inputs, targets = _reference_parts(case, device, on_failure)

    # The README's quickstart form: a closure that runs forward and opt.backward, handed to opt.step.
    def micro_step(batch_idx: int, is_last: bool) -> None:
        with context.batch(batch_idx, is_last=is_last):

            def closure() -> torch.Tensor:
                with context.autocast():
                    loss = mse(model(inputs), targets)
                optimizer.backward(loss)
                return loss

            optimizer.step(closure)

    note = "closure form (README quickstart)" + _accumulation_note(case) + _policy_note(on_failure)
    return StepLoop(_policy_impl("reference", on_failure), note, micro_step, case, device, model)


def _reference_direct(case: Case, device: torch.device, on_failure: str = "discard") -> Loop:
    context, model, optimizer, inputs, targets = _reference_parts(case, device, on_failure)

    def micro_step(batch_idx: int, is_last: bool) -> None:
        with context.batch(batch_idx, is_last=is_last):
            with context.autocast():
                loss = mse(model(inputs), targets)
            optimizer.backward(loss)
            optimizer.step()

    note = "opt.backward(loss); opt.step() without a closure" + _accumulation_note(case) + _policy_note(on_failure)
    return StepLoop(_policy_impl("reference-direct", on_failure), note, micro_step, case, device, model)


def _reference_user_zero(case: Case, device: torch.device, *, every: int) -> Loop:
    context, model, optimizer, inputs, targets = _reference_parts(case, device, "discard", zero_grad_after_step=False)
    window = case.accumulate * every

    # zero_grad_after_step=False: the closure clears the gradients at the first micro-step of every ``every``-th
    # window, as Lightning's optimizer_zero_grad hook does (every=1) or an override that keeps them (every=2).
    def micro_step(batch_idx: int, is_last: bool) -> None:
        with context.batch(batch_idx, is_last=is_last):

            def closure() -> torch.Tensor:
                if batch_idx % window == 0:
                    optimizer.zero_grad()
                with context.autocast():
                    loss = mse(model(inputs), targets)
                optimizer.backward(loss)
                return loss

            optimizer.step(closure)

    cadence = "each window's first micro-step" if every == 1 else "every other window's first micro-step"
    note = f"zero_grad_after_step=False, zero_grad() at {cadence}" + _accumulation_note(case)
    return StepLoop("reference-user-zero" if every == 1 else "reference-carry", note, micro_step, case, device, model)


def _accumulation_note(case: Case) -> str:
    return f", accumulate_grad_batches={case.accumulate}" if case.accumulate > 1 else ""


def _policy_note(on_failure: str) -> str:
    return "" if on_failure == "discard" else f", on_failure={on_failure!r}"


def _policy_impl(impl: str, on_failure: str) -> str:
    return impl if on_failure == "discard" else f"{impl}-{on_failure}"


# -- PyTorch Lightning -----------------------------------------------------------------------------------


def _lightning(case: Case, device: torch.device) -> Loop:
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError as exc:
        raise Unavailable(f"pytorch_lightning is not installed ({exc})") from exc
    quiet_frameworks()
    return _LightningLoop(case, device)


class _LightningLoop(Loop):
    """A real ``Trainer.fit`` in manual optimization over ``warmup + steps`` windows of the same batch.

    ``self.optimizers()`` hands out the ``LightningOptimizer``; ``manual_backward`` and its ``step`` go through the
    Trainer's strategy and precision plugin. The ``training_step`` body is timed (a step: the sum over its
    window's micro-steps); the Trainer's loop around it (data, hooks, progress, entering autocast under
    16-mixed) is not. With accumulation the body is the manual-optimization recipe of Lightning's documentation:
    ``manual_backward(loss / k)``, then ``step`` and ``zero_grad`` on every k-th batch.
    """

    impl = "lightning"

    def __init__(self, case: Case, device: torch.device) -> None:
        import pytorch_lightning as pl
        from pytorch_lightning.plugins.precision import MixedPrecision

        self._pl, self._case = pl, case
        self._trainer_kwargs: dict[str, Any] = {"accelerator": "gpu" if device.type == "cuda" else "cpu"}
        self.note = "Trainer.fit, manual optimization, training_step timed"
        if case.accumulate > 1:
            self.note += f"; manual_backward(loss / {case.accumulate}), step every {case.accumulate}th batch"
        if case.precision == "16-mixed" and device.type == "cpu":
            # Trainer(precision="16-mixed") on CPU switches to bf16; this plugin keeps fp16 with a GradScaler.
            self._trainer_kwargs["plugins"] = [MixedPrecision("16-mixed", "cpu")]
            self.note += "; fp16 via plugins=[MixedPrecision('16-mixed', 'cpu')]"
        else:
            self._trainer_kwargs["precision"] = case.precision
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def time(self, warmup: int, steps: int) -> list[int]:
        k = self._case.accumulate
        micro_ns: list[int] = []
        module = _timed_manual_module(self._pl, self._case, self._sync, micro_ns)
        trainer = self._pl.Trainer(devices=1, max_epochs=1, barebones=True, **self._trainer_kwargs)
        batches = _SameBatch(*self._case.model.data(torch.device("cpu")), length=(warmup + steps) * k)
        trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
        timed = micro_ns[warmup * k :]
        if len(timed) != steps * k:
            raise RuntimeError(f"the Lightning fit ran {len(micro_ns)} training steps, not {(warmup + steps) * k}")
        return [sum(timed[index : index + k]) for index in range(0, len(timed), k)]


class _SameBatch(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """The same batch ``length`` times (the other loops also train on one fixed batch)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, length: int) -> None:
        self._batch, self._length = (inputs, targets), length

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self._batch for _ in range(self._length))

    def __len__(self) -> int:
        return self._length


def _timed_manual_module(pl: Any, case: Case, sync: Callable[[], None] | None, micro_ns: list[int]) -> Any:
    k = case.accumulate

    class TimedManualModule(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = case.model.build()
            self.automatic_optimization = False

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            start = time.perf_counter_ns()
            inputs, targets = batch
            optimizer = self.optimizers()
            if k == 1:
                optimizer.zero_grad()
                loss = mse(self.model(inputs), targets)
                self.manual_backward(loss)
                optimizer.step()
            else:
                loss = mse(self.model(inputs), targets) / k
                self.manual_backward(loss)
                if (batch_idx + 1) % k == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            if sync is not None:
                sync()
            micro_ns.append(time.perf_counter_ns() - start)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return case.build_optimizer(self.model.parameters())

    return TimedManualModule()


# -- Lightning Fabric ------------------------------------------------------------------------------------


def _fabric(case: Case, device: torch.device) -> Loop:
    try:
        from lightning_fabric import Fabric
        from lightning_fabric.plugins import MixedPrecision
    except ImportError as exc:
        raise Unavailable(f"lightning_fabric is not installed ({exc})") from exc
    quiet_frameworks()
    note = "fabric.setup, fabric.backward, optimizer.step"
    if case.precision == "16-mixed" and device.type == "cpu":
        # Fabric(precision="16-mixed") on CPU switches to bf16; this plugin keeps fp16 with a GradScaler.
        fabric = Fabric(accelerator="cpu", devices=1, plugins=MixedPrecision("16-mixed", "cpu"))
        note += "; fp16 via plugins=MixedPrecision('16-mixed', 'cpu')"
    else:
        fabric = Fabric(accelerator=device.type, devices=1, precision=case.precision)
    module = case.model.build()
    model, optimizer = fabric.setup(module, case.build_optimizer(module.parameters()))
    inputs, targets = case.model.data(fabric.device)
    k = case.accumulate
    if k == 1:

        def iteration(batch_idx: int, is_last: bool) -> None:
            optimizer.zero_grad()
            loss = mse(model(inputs), targets)
            fabric.backward(loss)
            optimizer.step()

        return StepLoop("fabric", note, iteration, case, device, model)

    # Fabric's gradient-accumulation recipe (no_backward_sync on the micro-steps that do not step), with the
    # window closing on its last batch as everywhere here, and the loss divided by k for the window's mean.
    def accumulating(batch_idx: int, is_last: bool) -> None:
        is_accumulating = not _closes(case, batch_idx, is_last)
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            loss = mse(model(inputs), targets) / k
            fabric.backward(loss)
        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()

    note += f"; no_backward_sync, loss / {k}, step every {k}th"
    return StepLoop("fabric", note, accumulating, case, device, model)


# -- Accelerate ------------------------------------------------------------------------------------------


def _accelerate(case: Case, device: torch.device) -> Loop:
    try:
        from accelerate import Accelerator  # type: ignore[import-untyped]
    except ImportError as exc:
        raise Unavailable(f"accelerate is not installed ({exc})") from exc
    quiet_frameworks()
    mixed_precision = "fp16" if case.precision == "16-mixed" else "no"
    k = case.accumulate
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=mixed_precision, gradient_accumulation_steps=k)
    note = "accelerator.prepare, accelerator.backward, optimizer.step"
    if mixed_precision == "fp16" and accelerator.scaler is None:
        note += "; fp16 ignored on CPU by Accelerate (no autocast, no GradScaler): 32-bit work"
    module = case.model.build()
    model, optimizer = accelerator.prepare(module, case.build_optimizer(module.parameters()))
    inputs, targets = case.model.data(accelerator.device)
    if k == 1:

        def iteration(batch_idx: int, is_last: bool) -> None:
            optimizer.zero_grad()
            loss = mse(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()

        return StepLoop("accelerate", note, iteration, case, device, model)

    # Accelerate's recipe: gradient_accumulation_steps=k, every micro-step inside accelerator.accumulate(model);
    # backward divides the loss by k, and the prepared optimizer steps (and zeroes) on every k-th micro-step only.
    def accumulating(batch_idx: int, is_last: bool) -> None:
        with accelerator.accumulate(model):
            loss = mse(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    note += f"; gradient_accumulation_steps={k}, accelerator.accumulate(model)"
    return StepLoop("accelerate", note, accumulating, case, device, model)
