"""Loads the suite's plugin when the suite is run by path: ``pytest conformance --impl=module``."""

pytest_plugins = ["lightning_optimizer.conformance.plugin"]
