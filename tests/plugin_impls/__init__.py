"""Small fake implementation modules that ``tests/test_plugin.py`` runs the conformance suite against.

Each module is importable as ``plugin_impls.<name>`` with ``PYTHONPATH=<repo>/tests``.
"""
