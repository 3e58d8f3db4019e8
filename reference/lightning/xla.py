"""The reference strategy on one XLA device, and the accelerator that finds XLA devices beyond a TPU.

``Trainer(strategy=ReferenceXLAStrategy(), devices=1)``; importable from :mod:`lightning_optimizer.reference.lightning`,
which registers it as ``"reference_xla"``. torch_xla is imported only when a device is looked for.
"""

from __future__ import annotations

import importlib.util

import torch
from lightning.pytorch.accelerators import XLAAccelerator
from lightning.pytorch.strategies.single_xla import SingleDeviceXLAStrategy

from lightning_optimizer.reference.lightning.base import LoopSelector, ReferenceStrategyBase
from lightning_optimizer.spec.implementation import GradScalerSettings

__all__ = ["ReferenceXLAAccelerator", "ReferenceXLAStrategy"]


class ReferenceXLAAccelerator(XLAAccelerator):
    """Lightning's XLA accelerator, finding devices on every PJRT backend, torch_xla's CPU backend included.

    On a TPU (torch_xla's runtime reports the device type ``"TPU"``) every answer is Lightning's own, so its
    device discovery there is unchanged. On another backend (``PJRT_DEVICE=CPU``), where Lightning's accelerator
    asks the TPU metadata server and reports itself unavailable, the devices are the ones torch_xla's runtime
    addresses. :class:`ReferenceXLAStrategy` brings it; it is not passed to the ``Trainer`` on its own.
    """

    @staticmethod
    def _runtime() -> tuple[str | None, int]:
        from lightning_optimizer.reference.xla import runtime_devices

        return runtime_devices()

    @staticmethod
    def auto_device_count() -> int:  # type: ignore[override]  # Lightning's is wrapped in functools.lru_cache
        """The TPU's devices (Lightning's count) or those of torch_xla's runtime on another backend."""
        if importlib.util.find_spec("torch_xla") is None:
            return 0
        device_type, count = ReferenceXLAAccelerator._runtime()
        if device_type == "TPU":
            return XLAAccelerator.auto_device_count()
        return count

    @staticmethod
    def is_available() -> bool:  # type: ignore[override]  # Lightning's is wrapped in functools.lru_cache
        """torch_xla is installed and its runtime has a device."""
        try:
            return ReferenceXLAAccelerator.auto_device_count() > 0
        except (ValueError, AssertionError, OSError, RuntimeError):
            return False

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> int | list[int]:
        """``Trainer(devices=...)``: Lightning's rules on a TPU; one device (``1``, ``"1"``, ``[0]``) elsewhere."""
        if ReferenceXLAAccelerator._runtime()[0] == "TPU":
            return XLAAccelerator.parse_devices(devices)
        parsed = int(devices) if isinstance(devices, str) and devices.strip().isdigit() else devices
        if parsed == 1 or parsed == [0]:
            return parsed
        raise ValueError(
            f"Trainer(devices={devices!r}): the reference runs one XLA device through Lightning on this backend; "
            "use devices=1"
        )

    @staticmethod
    def get_parallel_devices(devices: int | list[int]) -> list[torch.device]:
        """The XLA devices the Trainer runs on."""
        parsed = ReferenceXLAAccelerator.parse_devices(devices)
        if isinstance(parsed, int):
            return [torch.device("xla", i) for i in range(parsed)]
        return [torch.device("xla", parsed[0])]


class ReferenceXLAStrategy(ReferenceStrategyBase, SingleDeviceXLAStrategy):  # type: ignore[misc]  # plugin: not XLAPrecision
    """One XLA device (a TPU core, or torch_xla's CPU backend), the reference doing precision and the step.

    ``Trainer(strategy=ReferenceXLAStrategy(), devices=1)``: the strategy brings :class:`ReferenceXLAAccelerator`,
    so ``accelerator`` is left out. On a real step the window's gradients are reduced once (torch_xla does nothing
    with one replica), the optimizer steps and the graph is cut once; micro-steps that only accumulate cut
    nothing. Checkpoints go through Lightning's ``XLACheckpointIO``. ``grad_scaler`` configures the 16-mixed loss
    scaler, as on the other strategies.
    """

    _DEVICE_TYPES = ("cpu", "cuda", "xla")

    def __init__(self, device: int = 0, *, grad_scaler: GradScalerSettings | None = None, debug: bool = False) -> None:
        self._loop_selector = LoopSelector(grad_scaler)
        super().__init__(
            device=device,
            accelerator=ReferenceXLAAccelerator(),
            precision_plugin=self._loop_selector.plugin,  # type: ignore[arg-type]  # the reference's, not XLAPrecision
            debug=debug,
        )
