"""One timed training iteration per implementation, each written the way its documentation tells users to.

Every loop trains its own copy of the case's model (same initial weights) with SGD on one fixed batch, and
reports the wall time of each iteration (zero_grad, forward, backward, step) in nanoseconds. On CUDA each
iteration ends with ``torch.cuda.synchronize()`` inside the timed region.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bench.cases import IMPLEMENTATIONS, LEARNING_RATE, Case, mse


class Unavailable(Exception):
    """An implementation that cannot run here; the message says why."""


class Loop(ABC):
    """An implementation's training loop on one case."""

    impl: str
    note: str

    @abstractmethod
    def run(self, iterations: int) -> list[int]:
        """Run ``iterations`` timed iterations; return each one's wall time in nanoseconds."""

    def close(self) -> None:  # noqa: B027 - a no-op unless the loop holds something
        """Release what the loop holds (a thread, for Lightning)."""


class StepLoop(Loop):
    """A loop whose iteration is a plain function of the batch index, timed call by call."""

    def __init__(self, impl: str, note: str, iteration: Callable[[int], object], device: torch.device) -> None:
        self.impl, self.note = impl, note
        self._iteration = iteration
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None
        self._batch_idx = 0

    def run(self, iterations: int) -> list[int]:
        iteration, sync, clock = self._iteration, self._sync, time.perf_counter_ns
        samples = []
        for _ in range(iterations):
            start = clock()
            iteration(self._batch_idx)
            if sync is not None:
                sync()
            samples.append(clock() - start)
            self._batch_idx += 1
        return samples


def build_loop(impl: str, case: Case, device: torch.device) -> Loop:
    """The loop of ``impl`` on ``case``; :class:`Unavailable` when its framework is missing or refuses."""
    builders: dict[str, Callable[[Case, torch.device], Loop]] = {
        "raw": _raw,
        "reference": _reference_closure,
        "reference-direct": _reference_direct,
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


# -- raw PyTorch -----------------------------------------------------------------------------------------


def _raw(case: Case, device: torch.device) -> Loop:
    model = case.model.build().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    inputs, targets = case.model.data(device)
    if case.precision == "32-true":

        def iteration(batch_idx: int) -> None:
            optimizer.zero_grad()
            loss = mse(model(inputs), targets)
            loss.backward()
            optimizer.step()

        return StepLoop("raw", "zero_grad, forward, backward, step", iteration, device)

    # The loop of PyTorch's AMP examples: autocast forward, scaled backward, scaler.step, scaler.update.
    scaler = torch.amp.grad_scaler.GradScaler(device.type)

    def amp_iteration(batch_idx: int) -> None:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=torch.float16):
            loss = mse(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return StepLoop("raw", "hand-written GradScaler loop", amp_iteration, device)


# -- the reference ---------------------------------------------------------------------------------------


def _reference_parts(case: Case, device: torch.device) -> tuple[Any, torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
    from lightning_optimizer.reference import TrainingContext

    context = TrainingContext(precision=case.precision, device="cuda" if device.type == "cuda" else "cpu")
    model = context.prepare_module(case.model.build())
    optimizer = context.wrap(torch.optim.SGD(model.parameters(), lr=LEARNING_RATE))
    inputs, targets = case.model.data(context.device)
    return context, model, optimizer, inputs, targets


def _reference_closure(case: Case, device: torch.device) -> Loop:
    context, model, optimizer, inputs, targets = _reference_parts(case, device)

    # The README's quickstart form: a closure that runs forward and opt.backward, handed to opt.step.
    def iteration(batch_idx: int) -> None:
        with context.batch(batch_idx):

            def closure() -> torch.Tensor:
                with context.autocast():
                    loss = mse(model(inputs), targets)
                optimizer.backward(loss)
                return loss

            optimizer.step(closure)

    return StepLoop("reference", "closure form (README quickstart)" + _freeing_note(case, device), iteration, device)


def _reference_direct(case: Case, device: torch.device) -> Loop:
    context, model, optimizer, inputs, targets = _reference_parts(case, device)

    def iteration(batch_idx: int) -> None:
        with context.batch(batch_idx):
            with context.autocast():
                loss = mse(model(inputs), targets)
            optimizer.backward(loss)
            optimizer.step()

    note = "opt.backward(loss); opt.step() without a closure" + _freeing_note(case, device)
    return StepLoop("reference-direct", note, iteration, device)


def _freeing_note(case: Case, device: torch.device) -> str:
    if device.type != "cpu" or case.model.width * case.model.width * case.model.layers < 1 << 20:
        return ""
    # Measured: with MALLOC_TRIM_THRESHOLD_=2000000000 in the environment these rows fall to the raw loop's time.
    return (
        "; the real step sets the gradients to None, and glibc hands their pages back to the OS for the next "
        "backward to fault in again (raw zeroes right before its forward instead)"
    )


# -- PyTorch Lightning -----------------------------------------------------------------------------------


def _lightning(case: Case, device: torch.device) -> Loop:
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError as exc:
        raise Unavailable(f"pytorch_lightning is not installed ({exc})") from exc
    quiet_frameworks()
    return _LightningLoop(case, device)


class _LightningLoop(Loop):
    """A real ``Trainer.fit`` in manual optimization, in a thread of its own, one training step per request.

    ``self.optimizers()`` hands out the ``LightningOptimizer``; ``manual_backward`` and its ``step`` go through the
    Trainer's strategy and precision plugin. The ``training_step`` body is timed; the Trainer's loop around it
    (data, hooks, progress, entering autocast under 16-mixed) is not. Between steps the fit waits in
    ``on_train_batch_start`` for the next request, so the other implementations' iterations can be interleaved
    with Lightning's one by one while the fit stays a single, ordinary ``Trainer.fit``.
    """

    impl = "lightning"

    def __init__(self, case: Case, device: torch.device) -> None:
        import pytorch_lightning as pl
        from pytorch_lightning.plugins.precision import MixedPrecision

        trainer_kwargs: dict[str, Any] = {"accelerator": "gpu" if device.type == "cuda" else "cpu"}
        self.note = "Trainer.fit, manual optimization, training_step timed"
        if case.precision == "16-mixed" and device.type == "cpu":
            # Trainer(precision="16-mixed") on CPU switches to bf16; this plugin keeps fp16 with a GradScaler.
            trainer_kwargs["plugins"] = [MixedPrecision("16-mixed", "cpu")]
            self.note += "; fp16 via plugins=[MixedPrecision('16-mixed', 'cpu')]"
        else:
            trainer_kwargs["precision"] = case.precision
        self._requests: queue.Queue[bool] = queue.Queue()
        self._samples: queue.Queue[int | BaseException] = queue.Queue()
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        module = _timed_manual_module(pl, case.model.build(), sync, self._requests, self._samples)
        trainer = pl.Trainer(devices=1, max_epochs=1, barebones=True, **trainer_kwargs)
        batches = _SameBatch(*case.model.data(torch.device("cpu")))
        # Intra-op threads are a per-thread setting (OpenMP): the fit's thread takes this thread's.
        threads = torch.get_num_threads()
        self._thread = threading.Thread(
            target=self._fit, args=(trainer, module, batches, threads), name="lightning-fit", daemon=True
        )
        self._thread.start()

    def _fit(self, trainer: Any, module: Any, batches: _SameBatch, threads: int) -> None:
        torch.set_num_threads(threads)
        try:
            trainer.fit(module, torch.utils.data.DataLoader(batches, batch_size=None))
        except BaseException as exc:  # reported to the timing thread, which raises it
            self._samples.put(exc)

    def run(self, iterations: int) -> list[int]:
        samples = []
        for _ in range(iterations):
            self._requests.put(True)
            sample = self._samples.get(timeout=600)
            if isinstance(sample, BaseException):
                raise RuntimeError("the Lightning Trainer failed") from sample
            samples.append(sample)
        return samples

    def close(self) -> None:
        self._requests.put(False)
        self._thread.join(timeout=60)


class _SameBatch(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """The same batch, endlessly (the other loops also train on one fixed batch); the fit ends on request."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self._batch = (inputs, targets)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return itertools.repeat(self._batch)


def _timed_manual_module(
    pl: Any,
    model: torch.nn.Module,
    sync: Callable[[], None] | None,
    requests: queue.Queue[bool],
    samples: queue.Queue[int | BaseException],
) -> Any:
    class TimedManualModule(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.automatic_optimization = False
            self.last_sample: int | None = None

        def on_train_batch_start(self, batch: object, batch_idx: int) -> int | None:
            # Report the previous step and wait for the next request here, where the fit would block anyway.
            if self.last_sample is not None:
                samples.put(self.last_sample)
            return None if requests.get() else -1  # -1 ends the epoch, and with max_epochs=1 the fit

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            start = time.perf_counter_ns()
            inputs, targets = batch
            optimizer = self.optimizers()
            optimizer.zero_grad()
            loss = mse(self.model(inputs), targets)
            self.manual_backward(loss)
            optimizer.step()
            if sync is not None:
                sync()
            self.last_sample = time.perf_counter_ns() - start

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)

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
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=LEARNING_RATE))
    inputs, targets = case.model.data(fabric.device)

    def iteration(batch_idx: int) -> None:
        optimizer.zero_grad()
        loss = mse(model(inputs), targets)
        fabric.backward(loss)
        optimizer.step()

    return StepLoop("fabric", note, iteration, device)


# -- Accelerate ------------------------------------------------------------------------------------------


def _accelerate(case: Case, device: torch.device) -> Loop:
    try:
        from accelerate import Accelerator  # type: ignore[import-untyped]
    except ImportError as exc:
        raise Unavailable(f"accelerate is not installed ({exc})") from exc
    quiet_frameworks()
    mixed_precision = "fp16" if case.precision == "16-mixed" else "no"
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision=mixed_precision)
    note = "accelerator.prepare, accelerator.backward, optimizer.step"
    if mixed_precision == "fp16" and accelerator.scaler is None:
        note += "; fp16 ignored on CPU by Accelerate (no autocast, no GradScaler): 32-bit work"
    module = case.model.build()
    model, optimizer = accelerator.prepare(module, torch.optim.SGD(module.parameters(), lr=LEARNING_RATE))
    inputs, targets = case.model.data(accelerator.device)

    def iteration(batch_idx: int) -> None:
        optimizer.zero_grad()
        loss = mse(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()

    return StepLoop("accelerate", note, iteration, device)
