"""``lightning-optimizer-conformance``: run the installed suite against an implementation.

Every argument goes to pytest, e.g. ``lightning-optimizer-conformance --impl=my_pkg.wrapper
--precisions=32-true --report-json=conformance.json``.
"""

from __future__ import annotations

import sys

import pytest

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the suite with the plugin loaded; return pytest's exit code."""
    args = sys.argv[1:] if argv is None else argv
    return int(
        pytest.main(
            [
                "-p",
                "lightning_optimizer.conformance.plugin",
                "--pyargs",
                "lightning_optimizer.conformance",
                *args,
            ]
        )
    )


if __name__ == "__main__":
    sys.exit(main())
