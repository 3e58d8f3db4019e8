"""What the Lightning tests and their subprocess scenarios (run as ``python -m lightning_scenarios.<name>``) share.

Importing it installs the Lightning namespace of the run (:mod:`lightning_scenarios.namespace`), before anything
imports Lightning.
"""

from lightning_scenarios.namespace import install

install()
