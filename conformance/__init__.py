"""The conformance suite: pytest checks of an implementation of the optimizer-wrapper contract.

Run it from a checkout with ``pytest conformance --impl=module``, or on an installed package with
``lightning-optimizer-conformance --impl=module``. The implementation module defines ``conformance_info()``
returning a :class:`lightning_optimizer.spec.ImplementationInfo`.
"""
