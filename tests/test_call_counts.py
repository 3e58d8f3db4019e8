"""The reference's Python calls per micro-step stay where they were measured (``python -m bench.calls``).

A count, unlike a time, does not depend on the machine's load: a change that adds calls to every micro-step (a
check, a region, a transaction entered where none is needed) fails here, with the table to compare. Two limits per
case and call form:

- the reference's own calls per micro-step (its functions only), the same on every torch: measured, plus one;
- the ratio of all calls to raw PyTorch's loop, which depends on torch's own calls (torch 2.13's loop makes about 30%
  fewer than 2.9's): measured on each torch CI runs, plus 0.05; on another torch, the largest of those.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is a folder of the checkout, not installed
from bench.calls import CALL_CASES, FORMS, count_calls
from bench.cases import TIMED_CASES

OWN_CALLS: dict[tuple[str, str], float] = {
    # (case, form): the reference's own calls per micro-step
    ("small-adam-32-true", "closure"): 81,
    ("small-adam-32-true", "direct"): 87,
    ("small-adam-acc4-32-true", "closure"): 63,
    ("small-adam-acc4-32-true", "direct"): 64,
    ("small-adam-16-mixed", "closure"): 117,
    ("small-adam-16-mixed", "direct"): 109,
    ("small-adam-acc4-16-mixed", "closure"): 87,
    ("small-adam-acc4-16-mixed", "direct"): 73,
}
RATIOS: dict[str, dict[tuple[str, str], float]] = {
    # torch's major.minor: (case, form): all calls per micro-step over raw PyTorch's
    "2.9": {
        ("small-adam-32-true", "closure"): 1.08,
        ("small-adam-32-true", "direct"): 1.04,
        ("small-adam-acc4-32-true", "closure"): 1.49,
        ("small-adam-acc4-32-true", "direct"): 1.47,
        ("small-adam-16-mixed", "closure"): 1.22,
        ("small-adam-16-mixed", "direct"): 1.10,
        ("small-adam-acc4-16-mixed", "closure"): 1.63,
        ("small-adam-acc4-16-mixed", "direct"): 1.38,
    },
    "2.13": {
        ("small-adam-32-true", "closure"): 1.32,
        ("small-adam-32-true", "direct"): 1.26,
        ("small-adam-acc4-32-true", "closure"): 1.71,
        ("small-adam-acc4-32-true", "direct"): 1.69,
        ("small-adam-16-mixed", "closure"): 1.43,
        ("small-adam-16-mixed", "direct"): 1.28,
        ("small-adam-acc4-16-mixed", "closure"): 1.79,
        ("small-adam-acc4-16-mixed", "direct"): 1.5,
    },
}


def _ratio_limits() -> dict[tuple[str, str], float]:
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version in RATIOS:
        return RATIOS[version]
    return {key: max(limits[key] for limits in RATIOS.values()) for key in OWN_CALLS}


def test_every_case_and_form_has_its_limits() -> None:
    expected = {(case, form) for case in CALL_CASES for form in FORMS}
    assert set(OWN_CALLS) == expected
    for version, limits in RATIOS.items():
        assert set(limits) == expected, f"torch {version}"


@pytest.mark.parametrize("case", CALL_CASES)
def test_calls_per_micro_step_stay_within_their_limit(case: str) -> None:
    timed = TIMED_CASES[case]
    raw = count_calls("raw", timed)
    ratio_limits = _ratio_limits()
    over = []
    for form, impl in FORMS.items():
        own_limit, ratio_limit = OWN_CALLS[case, form], ratio_limits[case, form]
        count = count_calls(impl, timed)
        ratio = count.calls / raw.calls
        if count.own > own_limit or ratio > ratio_limit:
            over.append(
                f"{form}: {count.own:.1f} calls of the reference (limit {own_limit}), {ratio:.2f}x raw PyTorch's "
                f"{raw.calls:.1f} (limit {ratio_limit} on torch {torch.__version__}); `python -m bench.calls --top 20` "
                "shows where they go"
            )
    assert not over, f"{case}: more Python calls per micro-step than measured:\n" + "\n".join(over)
