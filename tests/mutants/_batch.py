"""Run ``pytest conformance`` once per case in one interpreter, so that torch is imported once per batch.

``python -m mutants._batch CASES.json``: CASES is a list of ``{"id": ..., "args": [...], "out": DIR}``; each case
is a fresh ``pytest.main(["conformance", *args])`` session from the current folder (the repository root), exactly
as ``python -m pytest conformance ARGS`` would run it (ARGS place pytest's cache, e.g. ``-o cache_dir=...``). Its output
goes to ``DIR/output.txt`` and its exit status to ``DIR/exit``, written as soon as the case ends, so a batch that
dies part-way still leaves the results of the cases before. The suite's rank pools (the processes of its DDP, FSDP
and SPMD cells) outlive each session and serve the next (``LIGHTNING_OPTIMIZER_KEEP_RANK_POOLS``): starting them
costs seconds, and each request names the implementation it runs on.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest


def main(cases_file: str) -> int:
    """Run every case in order."""
    os.environ["LIGHTNING_OPTIMIZER_KEEP_RANK_POOLS"] = "1"
    for case in json.loads(Path(cases_file).read_text(encoding="utf-8")):
        out = Path(case["out"])
        out.mkdir(parents=True, exist_ok=True)
        with (
            (out / "output.txt").open("w", encoding="utf-8") as log,
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
        ):
            code = pytest.main(["conformance", *case["args"]])
        (out / "exit").write_text(str(int(code)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
