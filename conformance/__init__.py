"""The conformance suite: pytest checks of an implementation of the optimizer-wrapper contract.

Run it from a checkout with ``pytest conformance --impl=module``, or on an installed package with
``lightning-optimizer-conformance --impl=module``. The implementation module defines ``conformance_info()``
returning a :class:`lightning_optimizer.spec.ImplementationInfo`.
"""

import importlib.metadata as _metadata

try:
    # Read here rather than from lightning_optimizer.spec, which imports torch: the console script's first lines
    # (its check for pytest, hypothesis and mypy) stay light.
    __version__: str = _metadata.version("lightning-optimizer")
except _metadata.PackageNotFoundError:  # the sources imported without an install
    __version__ = "0+unknown"
