"""Run ``pytest conformance`` once per case in one interpreter, so that torch is imported only once.

``python -m plugin_impls.run_many CASES.json RESULTS.json``: CASES maps a case id to ``{"args": [...],
"env": {...}}`` (pytest arguments, and environment variables set for that case only); RESULTS maps each id to
``{"exit": ..., "stdout": ..., "stderr": ...}``. Each case is a fresh ``pytest.main`` session from the
repository root, as ``python -m pytest conformance -p no:cacheprovider ARGS`` would be.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@contextlib.contextmanager
def _environment(overrides: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def main(cases_file: str, results_file: str) -> None:
    cases: dict[str, dict[str, Any]] = json.loads(Path(cases_file).read_text(encoding="utf-8"))
    results = {}
    for case, spec in cases.items():
        out, err = io.StringIO(), io.StringIO()
        with _environment(spec.get("env", {})), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = pytest.main(["conformance", "-p", "no:cacheprovider", *spec["args"]])
        results[case] = {"exit": int(code), "stdout": out.getvalue(), "stderr": err.getvalue()}
    Path(results_file).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
