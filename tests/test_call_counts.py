"""The reference's Python calls per micro-step stay where they were measured (``python -m bench.calls``).

A count, unlike a time, does not depend on the machine's load: a change that adds calls to every micro-step (a
check, a region, a transaction entered where none is needed) fails here, with the table to compare. The limits are
the counts measured on torch 2.9 with a margin of one call per micro-step for the reference's own functions, and
its ratio to raw PyTorch's calls with a margin of 0.05 (torch's own calls differ a little between releases).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is a folder of the checkout, not installed
from bench.calls import CALL_CASES, FORMS, count_calls
from bench.cases import TIMED_CASES

LIMITS: dict[tuple[str, str], tuple[float, float]] = {
    # (case, form): (the reference's own calls per micro-step, ratio of all calls to raw PyTorch's)
    ("small-adam-32-true", "closure"): (80, 1.09),
    ("small-adam-32-true", "direct"): (72, 1.03),
    ("small-adam-acc4-32-true", "closure"): (57, 1.48),
    ("small-adam-acc4-32-true", "direct"): (44, 1.32),
    ("small-adam-16-mixed", "closure"): (113, 1.21),
    ("small-adam-16-mixed", "direct"): (94, 1.11),
    ("small-adam-acc4-16-mixed", "closure"): (78, 1.60),
    ("small-adam-acc4-16-mixed", "direct"): (52, 1.28),
}


def test_every_case_and_form_has_a_limit() -> None:
    assert set(LIMITS) == {(case, form) for case in CALL_CASES for form in FORMS}


@pytest.mark.parametrize("case", CALL_CASES)
def test_calls_per_micro_step_stay_within_their_limit(case: str) -> None:
    timed = TIMED_CASES[case]
    raw = count_calls("raw", timed)
    over = []
    for form, impl in FORMS.items():
        own_limit, ratio_limit = LIMITS[case, form]
        count = count_calls(impl, timed)
        ratio = count.calls / raw.calls
        if count.own > own_limit or ratio > ratio_limit:
            over.append(
                f"{form}: {count.own:.1f} calls of the reference (limit {own_limit}), {ratio:.2f}x raw PyTorch's "
                f"{raw.calls:.1f} (limit {ratio_limit}); `python -m bench.calls --top 20` shows where they go"
            )
    assert not over, f"{case}: more Python calls per micro-step than measured:\n" + "\n".join(over)
