"""The rig of the checks of optimizers that evaluate the closure themselves: a wrapped LBFGS beside a bare one.

:class:`LbfgsRig` builds a context around LBFGS (on half ``a`` of :class:`.harness.Halves`, beside an SGD wrapper on
half ``b``, or on a whole model) and a bare ``torch.optim.LBFGS`` on the oracle's copy, whose closure
(:func:`.optimizer_kinds.toggled_closure`) zeroes, toggles ``b`` off and clips by hand. Each :meth:`LbfgsRig.step`
steps both and compares what they return; the flags every evaluation saw are kept for :meth:`LbfgsRig.assert_toggled`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from lightning_optimizer.conformance.assertions import requires_grad_flags
from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, Batch, Halves, cell_device, cell_dtype, mse
from lightning_optimizer.conformance.optimizer_kinds import closure_of, toggled_closure
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import ClipFunction, real_step, scaled_backward
from lightning_optimizer.spec import Cell, TrainingContext

__all__ = ["LBFGS_HYPER", "SGD_LR", "LbfgsRig"]

MakeContext = Callable[..., TrainingContext]
LBFGS_HYPER: dict[str, Any] = {"lr": 0.5, "max_iter": 4, "line_search_fn": "strong_wolfe"}
"""Four iterations per step: five evaluations of the closure, and parameters that move between them. With a line
search LBFGS converges here, clipped or not: a last-bit difference of a valid implementation (a norm summed in
another order) stays far inside the tolerance, which it would not if the steps diverged."""
SGD_LR = 0.1


class LbfgsRig:
    """A wrapped LBFGS and a bare one on the oracle's copy; on :class:`Halves`, LBFGS on ``a`` and SGD on ``b``.

    The wrapper's closure zeroes by ``zeroing`` (``"none"``, ``"set_to_none"``, ``"zeros"``) and calls
    ``wrapper.backward`` or ``loss.backward`` (``backward``). The bare LBFGS's closure zeroes, toggles ``b`` off and
    clips (``clip``: the context's clipping) by hand.
    """

    def __init__(
        self,
        make_context: MakeContext,
        cell: Cell,
        base: torch.nn.Module,
        hyper: dict[str, Any] = LBFGS_HYPER,
        clip: ClipFunction | None = None,
        zeroing: str = "set_to_none",
        backward: str = "wrapper",
        **settings: Any,
    ) -> None:
        self.cell, self.clip, self.zeroing, self.backward = cell, clip, zeroing, backward
        self.device, self.dtype, self.halves = cell_device(cell), cell_dtype(cell), isinstance(base, Halves)
        self.context = make_context(**settings)
        self.oracle, self.model = cast(Any, oracle_copy(base, cell)), cast(Any, self.context.prepare_module(base))
        lbfgs_params = (self.model.a if self.halves else self.model).parameters()
        self.lbfgs = self.context.wrap(torch.optim.LBFGS(lbfgs_params, **hyper))
        self.oracle_lbfgs = torch.optim.LBFGS((self.oracle.a if self.halves else self.oracle).parameters(), **hyper)
        if self.halves:
            self.sgd = self.context.wrap(torch.optim.SGD(self.model.b.parameters(), lr=SGD_LR))
            self.oracle_sgd = torch.optim.SGD(self.oracle.b.parameters(), lr=SGD_LR)
        self.evaluations: list[tuple[dict[str, bool], list[str]]] = []
        """As each evaluation of the wrapper's closures begins: the flags, and the parameters with a gradient."""
        self.oracle_evaluations = 0

    def loss(self, model: Any, batch: Batch) -> torch.Tensor:
        """The model's loss; on halves both halves': LBFGS sees ``b``'s term, which must not reach ``b``."""
        if self.halves:
            return mse(model.a, batch, self.device, self.dtype) + mse(model.b, batch, self.device, self.dtype)
        return mse(model, batch, self.device, self.dtype)

    def closure(self, batch: Batch) -> Callable[[], torch.Tensor]:
        """The wrapper's LBFGS closure: zero, forward, backward, return the loss."""

        def closure() -> torch.Tensor:
            with_grads = [name for name, param in self.model.named_parameters() if param.grad is not None]
            self.evaluations.append((requires_grad_flags(self.model), with_grads))
            if self.zeroing != "none":
                self.lbfgs.zero_grad(set_to_none=self.zeroing == "set_to_none")
            loss = self.loss(self.model, batch)
            self.lbfgs.backward(loss) if self.backward == "wrapper" else loss.backward()
            return loss

        return closure

    def step(self, batch: Batch, what: str = "an LBFGS step", make_optimizer_step: bool | None = None) -> None:
        """A step of the wrapper and of the bare LBFGS: the same loss returned; on halves, several evaluations."""

        def loss_of() -> torch.Tensor:
            self.oracle_evaluations += 1
            return self.loss(self.oracle, batch)

        others = self.oracle.b.parameters() if self.halves else ()
        oracle_closure = toggled_closure(self.oracle_lbfgs, loss_of, others, self.clip)
        start, tol = len(self.evaluations), REORDERED_TOLERANCES[self.cell.precision]
        got = self.lbfgs.step(self.closure(batch), make_optimizer_step=make_optimizer_step)
        want, msg = self.oracle_lbfgs.step(oracle_closure), f"{what}: step must return what LBFGS's own step returns"
        torch.testing.assert_close(got, want, rtol=tol.rtol, atol=tol.atol, msg=msg)
        several = not self.halves or len(self.evaluations) - start > 1
        assert several, "LBFGS was not allowed to evaluate the closure several times"

    def sgd_step(self, batch: Batch, make_optimizer_step: bool) -> None:
        """The SGD wrapper's call on ``b``."""
        self.sgd.step(closure_of(self.context, self.sgd, self.model.b, batch, self.cell), make_optimizer_step)

    def oracle_sgd_window(self, batches: list[Batch]) -> None:
        """The bare SGD's step on the mean of ``batches``' gradients of ``b``, clipped as the context clips."""
        for batch in batches:
            scaled_backward(mse(self.oracle.b, batch, self.device, self.dtype), None)
        real_step(self.oracle_sgd, len(batches), None, clip=self.clip)

    def assert_toggled(self, what: str) -> None:
        """Every evaluation so far saw only ``a`` requiring grad; every flag is back to ``True`` now."""
        for index, (seen, _) in enumerate(self.evaluations):
            wrong = {name: flag for name, flag in seen.items() if flag != name.startswith("a.")}
            assert not wrong, (
                f"{what}: in LBFGS evaluation {index} these flags were wrong (LBFGS's own parameters a.* must "
                f"require grad, the SGD wrapper's b.* must not): {wrong}"
            )
        after = requires_grad_flags(self.model)
        assert all(after.values()), f"{what}: flags not restored after the step: {after}"
