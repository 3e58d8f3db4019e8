"""``python -m lightning_scenarios.example examples/x.py``: an example run as ``__main__`` in the run's namespace.

The examples are written against ``lightning``, as users write them; with ``LIGHTNING_NAMESPACE=pytorch_lightning``
this runs them on ``pytorch_lightning`` and the reference's twin package (:mod:`lightning_scenarios.namespace`).
"""

import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m lightning_scenarios.example PATH_TO_EXAMPLE")
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
