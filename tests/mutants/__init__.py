"""Deliberately broken implementations of the contract, one defect per module.

Each module is importable as ``mutants.<name>`` with ``PYTHONPATH=<repo>/tests`` and exposes
``conformance_info()``, so the real suite runs against it with ``--impl=mutants.<name>``. ``tests/test_mutants.py``
proves that the checks named for each mutant catch it. The shared plumbing is in ``mutants._base``; run against
the suite on its own (``--impl=mutants._base``) it must pass everything, like the reference.
"""
