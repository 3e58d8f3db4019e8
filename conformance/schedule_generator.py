"""The property checks' schedules: what the Hypothesis generator draws, the explicit ones, and the CI budget.

:func:`schedules_of` draws the schedules of a check in a cell (derandomised, no example database, the explicit
ones first) and runs a check on each. ``GENERATED`` (and its variants per check) is what the generator draws, as
``dimensions.DIMENSIONS`` names it: the checks' ``varies`` markers, which ``tests/test_dimensions.py`` holds to what
the CI budget (``CI_EXAMPLES``) reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from lightning_optimizer.conformance.dimensions import DIMENSIONS
from lightning_optimizer.conformance.schedule_oracle import (
    CALL_FORMS,
    FREEZABLE,
    OPTIMIZER_KINDS,
    Call,
    CallForm,
    Clipping,
    Event,
    EventKind,
    HeadSpec,
    Iteration,
    Schedule,
    user_clears_after_copies,
)
from lightning_optimizer.spec import Cell, GradScalerSettings

try:
    import hypothesis.configuration
    from hypothesis import HealthCheck, Phase, example, given, settings
    from hypothesis import strategies as st

    HYPOTHESIS_MISSING: str | None = None
except ImportError as exc:  # the suite's other checks run without it
    HYPOTHESIS_MISSING = f"hypothesis is not installed ({exc}); pip install hypothesis"

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn, SearchStrategy

__all__ = [
    "CI_EXAMPLES",
    "CLIPPINGS",
    "FAULTS_GENERATED",
    "GENERATED",
    "HYPOTHESIS_MISSING",
    "RANK_GENERATED",
    "RESUME_GENERATED",
    "quiet_process_state",
    "schedules_of",
]

CI_EXAMPLES = {"oracle": 60, "faults": 40, "resume": 25, "ranks": 5}
"""Generated schedules per check and cell in a plain run (besides the explicit examples)."""

CLIPPINGS: tuple[Clipping, ...] = (("norm", 1.5e-3), ("value", 5e-4))
"""Thresholds that clip some of the schedule model's window gradients (norms ~1e-3 to 6e-3) and not others."""

GENERATED: dict[str, tuple[str, ...]] = {
    **{
        dimension: DIMENSIONS[dimension]  # every value of these
        for dimension in ("window", "make_optimizer_step", "position", "wrappers", "param_groups", "zero_grad")
    },
    "optimizer": tuple(  # the torch optimizers the schedules draw (the others have checks of their own)
        kind for kind in DIMENSIONS["optimizer"] if kind not in ("LBFGS", "step(closure) recorded", "two-pass (SAM)")
    ),
    "parameters": ("frozen", "frozen after wrap", "unfrozen after wrap", "no gradient in a window"),
    "call_form": ("closure, wrapper.backward", "closure, loss.backward", "toggle_model block, then step()"),
    "outcome_read": ("after every call of every wrapper",),
    "clipping": ("norm", "value"),
    "loss_scale": DIMENSIONS["loss_scale"],
    "copies": ("pickle", "deepcopy", "copy then overflow or growth"),
    "zero_grad_after_step": ("True", "False"),
}
"""What the generator of the oracle check draws, as ``dimensions.DIMENSIONS`` names it."""
FAULTS_GENERATED = GENERATED | {
    "faults": ("raising closure", "raising closure after its backward", "raising toggle_model block"),
    "on_failure": ("discard", "restore"),
}
"""The generator of the check with raising closures draws those too, and the check runs under both policies."""
RESUME_GENERATED = GENERATED | {"copies": ("checkpoint",)}
"""The resume check's generator: checkpoints instead of copies."""
RANK_GENERATED = {
    **{dimension: values for dimension, values in GENERATED.items() if dimension != "copies"},
    "parameters": ("frozen", "no gradient in a window"),
    "param_groups": ("1", "2 with other hyper-parameters"),
}
"""What the generator draws for a cell of several ranks: every dimension of ``GENERATED`` but those that change the
model's shape after preparation (events between iterations, parameters never used) and copies."""


def _draw_schedule(
    draw: DrawFn,
    cell: Cell,
    *,
    faults: bool,
    resumes: bool,
    copies: bool,
    ranks: bool = False,
    user_zero_grad: bool = False,
) -> Schedule:
    """A random schedule along every dimension of ``GENERATED``, plus raising attempts and checkpoints when asked.

    With ``ranks`` (a cell of several ranks) the model keeps its shape: no parameter the forward pass never uses and
    no event between iterations (DDP's reducer and FSDP's shards are built for the parameters at preparation).
    ``zero_grad_after_step`` is drawn either way, and is ``False`` only with ``user_zero_grad`` (the implementation
    claims the feature): the other draws are the same schedules either way.
    """
    sixteen_mixed = cell.precision == "16-mixed"
    count = draw(st.integers(1, 3))
    heads = tuple(
        HeadSpec(
            kind=draw(st.sampled_from(OPTIMIZER_KINDS)),
            groups=draw(st.integers(1, 2)),
            unused=not ranks and draw(st.integers(0, 3)) == 0,
            frozen=frozenset(draw(st.sets(st.sampled_from(FREEZABLE), max_size=1))),
        )
        for _ in range(count)
    )
    accumulate = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 7), min_size=1, max_size=2))
    # 16-mixed: a plain loss.backward() would skip the loss scaling that the wrapper owes [ACC-002].
    forms = tuple(form for form in CALL_FORMS if not (sixteen_mixed and form == "closure_plain_backward"))
    kinds: list[EventKind] = ["freeze", "unfreeze", "add_group", *(("pickle", "deepcopy") if copies else ())]
    added: set[int] = set()
    epochs = []
    for length in lengths:
        iterations = []
        for _ in range(length):
            events = []
            if not ranks and draw(st.integers(0, 4)) == 0:
                kind = draw(st.sampled_from(kinds))
                head = draw(st.integers(0, count - 1))
                if kind == "add_group" and head in added:
                    kind = "unfreeze"
                added |= {head} if kind == "add_group" else set()
                events.append(Event(kind, head, draw(st.sampled_from(FREEZABLE))))
            order = draw(st.permutations(range(count)))
            calls = tuple(
                Call(
                    optimizer,
                    make_optimizer_step=draw(st.sampled_from((None, True, False, None))),
                    form=draw(st.sampled_from(forms)),
                    zero_grad_first=draw(st.booleans()),
                    set_to_none=draw(st.booleans()),
                    non_finite=sixteen_mixed and draw(st.integers(0, 7)) == 0,
                    raises_first=faults and draw(st.integers(0, 3)) == 0,
                    raises_after_backward=faults and draw(st.booleans()),
                )
                for optimizer in order
                if draw(st.integers(0, 3)) > 0
            )
            in_batch = draw(st.integers(0, 5)) > 0
            iterations.append(Iteration(calls, tuple(events), in_batch))
        epochs.append(tuple(iterations))
    last = max(sum(lengths) - 2, 0)
    resume_after = frozenset(draw(st.sets(st.integers(0, last), min_size=1, max_size=2))) if resumes else frozenset()
    clipping = draw(st.sampled_from((None, None, *CLIPPINGS)))
    grad_scaler = None
    if sixteen_mixed and draw(st.booleans()):
        grad_scaler = GradScalerSettings(
            init_scale=2.0 ** draw(st.sampled_from((10, 13, 16))), growth_interval=draw(st.integers(1, 3))
        )
    leave = draw(st.booleans()) and user_zero_grad
    schedule = Schedule(heads, accumulate, tuple(epochs), resume_after, clipping, grad_scaler, not leave)
    return user_clears_after_copies(schedule)


def _explicit_schedules(
    cell: Cell, *, faults: bool, resumes: bool, copies: bool, user_zero_grad: bool = False, ranks: bool = False
) -> list[Schedule]:
    """Two schedules by hand: every rule on a fixed shape, then heads that change shape as the loop runs.

    The first: three optimizers and ``accumulate_grad_batches=3`` over epochs of 5 and 4 batches; windows cut
    short, flushed, and kept open by ``False`` (optimizer 2's across the epoch's end); every call form;
    ``zero_grad()`` on open windows; under 16-mixed an overflow of optimizer 2 while the windows of 0 and 1 stay
    open (the scale backs off, those windows are rescaled, Adam counts no step); with ``faults`` raising closures on
    an accumulating call, on calls that close a window of three and of one micro-step and in a ``toggle_model``
    block; with ``resumes`` checkpoints after iterations 1 and 5, where windows are open.

    The second: fused Adam with two parameter groups and a parameter it never gets a gradient for (first in its
    first group), SGD with momentum (foreach) with one frozen parameter; clipping by norm over windows of two; a
    group added to each optimizer after wrap, between its windows while the other's window is open (WIN-001); a
    parameter frozen, then unfrozen, after wrap; ``zero_grad(set_to_none=False)``; a window finished outside any
    batch (under 16-mixed the scaler updates right after each real step there); under 16-mixed a loss scale that
    grows every iteration and backs off after an overflow, across open windows; with ``copies`` a pickle and a
    deepcopy of the whole training state that go on training (overflowing and growing) while the originals must stay
    as they were.

    With ``user_zero_grad`` (the implementation claims the feature) a third: the first under
    ``zero_grad_after_step=False``, its windows carrying what the last real step left wherever no ``zero_grad()``
    came first (its overflow skipping a step that leaves nothing, scale changes over carried parts), and an epoch
    more in which a window fails after its backward right after taking what the last step left; there a parameter is
    frozen after wrap before another optimizer's call toggles it (and unfrozen again), with no copy in between.

    With ``ranks`` (a cell of several ranks) only the first: the second changes the model's shape, and the drawn
    schedules of the CI budget reach ``zero_grad_after_step=False`` and carrying windows there (a rank schedule costs
    seconds of the process group).
    """
    overflow = cell.precision == "16-mixed"
    plain: CallForm = "closure" if overflow else "closure_plain_backward"
    copied: list[tuple[Event, ...]] = [(Event("pickle"),), (Event("deepcopy"),)] if copies else [(), ()]
    fixed = (
        (
            (Call(0), Call(1, form="toggle_model", zero_grad_first=True), Call(2, True, non_finite=overflow)),
            (Call(1, False), Call(0, zero_grad_first=True, raises_first=faults)),
            (
                Call(0, raises_first=faults, raises_after_backward=True),
                Call(2, form="toggle_model", raises_first=faults),
                Call(1, form=plain),
            ),
            (Call(2, False), Call(0, True, zero_grad_first=True)),
            (Call(0, form="toggle_model"), Call(1, raises_first=faults), Call(2, False)),
        ),
        (
            (Call(0, False), Call(1), Call(2, form=plain)),
            (Call(1, form="toggle_model", zero_grad_first=True), Call(0)),
            (Call(2), Call(0), Call(1, False)),
            (Call(1), Call(0, raises_first=faults)),
        ),
    )
    changing = (
        (
            Iteration((Call(0),)),
            Iteration(
                (
                    Call(1, False, zero_grad_first=True, set_to_none=False),
                    Call(0, raises_first=faults, raises_after_backward=True),
                ),
                (Event("add_group", 1),),  # between 1's windows, while 0's is open [WIN-001]
            ),
            Iteration(
                (Call(0, True, form="toggle_model"), Call(1, non_finite=overflow)), (Event("freeze", 0, 2), *copied[0])
            ),
            Iteration(
                (Call(1, form="toggle_model", zero_grad_first=True), Call(0, True)),
                (Event("add_group", 0),),  # between 0's windows, while 1's is open
            ),
            Iteration((Call(0), Call(1)), (Event("unfreeze", 0, 2), *copied[1])),
            Iteration((Call(0), Call(1, False)), in_batch=False),
            Iteration((Call(1),), in_batch=False),
        ),
        (
            Iteration((Call(1, raises_first=faults), Call(0, zero_grad_first=True, set_to_none=False))),
            Iteration((Call(0, non_finite=overflow), Call(1, True))),
            Iteration((Call(0), Call(1))),
        ),
    )
    first = Schedule(
        (HeadSpec("sgd_momentum"), HeadSpec("sgd_momentum"), HeadSpec("adam")),
        3,
        tuple(tuple(Iteration(calls) for calls in epoch) for epoch in fixed),
        frozenset({1, 5}) if resumes else frozenset(),
    )
    # Under zero_grad_after_step=False, a third epoch: optimizer 0's window takes what its last step left and fails
    # after its backward (discarded or restored with it); under 16-mixed optimizer 1 then overflows while that
    # window is open and carries (the scale backs off, the carried part stays as it is); then both windows close.
    carrying = (
        Iteration((Call(0, True), Call(1, False)), (Event("freeze", 0, 0),)),
        Iteration(
            (Call(0, False, raises_first=faults, raises_after_backward=True), Call(1, True, non_finite=overflow))
        ),
        Iteration((Call(1, form="toggle_model"), Call(0, True, form="toggle_model")), (Event("unfreeze", 0, 0),)),
    )
    leaving = replace(first, epochs=(*first.epochs, carrying), zero_grad_after_step=False)
    if ranks:  # each rank schedule costs seconds of the process group: the drawn ones reach False and carrying
        return [first]
    leaving_schedules = [user_clears_after_copies(leaving)] if user_zero_grad else []
    return [
        first,
        Schedule(
            (HeadSpec("adam_fused", groups=2, unused=True), HeadSpec("sgd_foreach", frozen=frozenset({1}))),
            2,
            changing,
            frozenset({2, 5}) if resumes else frozenset(),
            ("norm", 1.5e-3),
            GradScalerSettings(init_scale=2.0**12, growth_interval=1) if overflow else None,
        ),
        *leaving_schedules,
    ]


def schedules_of(
    cell: Cell,
    budget: str,
    requested: int | None,
    *,
    faults: bool = False,
    resumes: bool = False,
    copies: bool = False,
    ranks: bool = False,
    user_zero_grad: bool = False,
    run: Callable[[Schedule], object] | None = None,
) -> list[Schedule]:
    """The schedules a property check runs in ``cell`` (its explicit ones first), running ``run`` on each.

    ``requested`` schedules are generated (and a failing one shrunk), else ``CI_EXAMPLES[budget]``. Without
    ``run`` it only draws them: the same schedules, as the derandomised generator draws them in the same order
    whatever the check does with them (as long as none fails). With ``ranks``, the schedules of a cell of several
    ranks (:func:`_draw_schedule`, :func:`_explicit_schedules`): no model that changes shape. ``user_zero_grad``:
    the implementation claims the feature, and about half the schedules run under ``zero_grad_after_step=False``.
    """
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if requested else ())
    strategy: SearchStrategy[Schedule] = st.composite(_draw_schedule)(
        cell, faults=faults, resumes=resumes, copies=copies, ranks=ranks, user_zero_grad=user_zero_grad
    )
    seen: list[Schedule] = []

    def generated(schedule: Schedule) -> None:
        seen.append(schedule)
        if run is not None:
            run(schedule)

    explicit = _explicit_schedules(
        cell, faults=faults, resumes=resumes, copies=copies, user_zero_grad=user_zero_grad, ranks=ranks
    )
    test = given(schedule=strategy)(generated)
    for schedule in reversed(explicit):
        test = example(schedule=schedule)(test)
    settings(
        max_examples=int(requested) if requested else CI_EXAMPLES[budget],
        derandomize=True,
        database=None,
        deadline=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(test)()
    return seen


@contextmanager
def quiet_process_state(storage: Path) -> Iterator[None]:
    """One CPU thread (tiny tensors: threads only wait on each other), Hypothesis's files under ``storage``.

    Hypothesis caches what it reads from local source files in its storage directory (``.hypothesis`` in the
    current folder by default); the suite writes nowhere but pytest's temporary folder.
    """
    threads = torch.get_num_threads()
    home = vars(hypothesis.configuration).get("__hypothesis_home_directory")
    torch.set_num_threads(1)
    hypothesis.configuration.set_hypothesis_home_dir(storage)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        hypothesis.configuration.set_hypothesis_home_dir(home)
