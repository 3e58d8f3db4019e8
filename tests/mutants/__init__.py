"""Deliberately broken implementations of the contract, one defect per module, in a folder per requirement family.

A mutant that breaks ``AMP-002`` lives in ``amp/`` (the lower-case prefix of its requirement's id), is importable as
``mutants.amp.<name>`` with ``PYTHONPATH=<repo>/tests`` and exposes ``conformance_info()``, so the real suite runs
against it with ``--impl=mutants.amp.<name>``. Each declares ``MUTANT = Mutant(...)`` (``mutants._declared``): the
requirement it breaks, the checks that must catch it, the cells they run on, and the blind batch that wrote it, if
one did. ``tests/test_mutants.py`` proves that those checks catch each mutant. The shared plumbing is in
``mutants._base``; run against the suite on its own (``--impl=mutants._base``) it must pass everything, like the
reference.
"""
